"""``torch._scaled_mm``'s block-wise FP8 GEMM (cuBLASLt): ``linear_fp8``'s ``kind="scaled_mm"``.

PyTorch multiplies E4M3 operands with 1x128 activation scales and 128x128 weight scales on sm_90
(cuBLASLt >= 12.9): the DeepSeek-V3 recipe, which is ours. Its contract, read from torch's
``_meta_registrations._check_scaled_mm_sizes{,_v2}`` and the ``scaled_mm`` samples of
``torch.testing._internal.common_methods_invocations``:

- A [M, K] row-major E4M3; B = W^T [K, N] column-major (our row-major W [N, K], transposed);
  K and N multiples of 16 on the GPU, and here of 128 (the scale tensors' shapes use K // 128
  and N // 128).
- scale_a [M, K/128] fp32 with stride (1, M): the per-token scales stored group-major.
- scale_b, the 128x128 block scales: the v2 API (``torch.nn.functional.scaled_mm`` with
  ``ScalingType.BlockWise1x128`` / ``BlockWise128x128``) wants [L4, N/128] with stride (1, L4),
  L4 = round_up(K/128, 4): ``weight_scale`` [N/128, K/128] with each row padded to L4 (16-byte
  rows), viewed transposed. The v1 ``torch._scaled_mm`` infers the recipe from the shapes alone
  and takes [K/128, N/128]: the same storage without the pad rows.

On the H200 (torch 2.11, CUDA 13.0) cuBLASLt found no algorithm for M = 1
(CUBLAS_STATUS_NOT_SUPPORTED from its heuristic) and ran M = 4, 32, 128 and 300: consistent with
scale_a's leading dimension (M fp32) needing 16-byte alignment, so M is padded to a multiple of
4 with zero rows (unit scales) and the pad rows of the output are dropped.

cuBLAS rounds the fp32 result to the output dtype; the residual is added after that rounding, as
in ``gemm_triton.finish_tile``. The scale re-layouts are two small copies per call (the tuner
times them with the GEMM: a forward pays them too, unless a loader keeps them prepared).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GROUP = 128


def has_v2() -> bool:
    """Whether this torch has the explicit-recipe API (``torch.nn.functional.scaled_mm``)."""
    return hasattr(F, "scaled_mm") and hasattr(F, "ScalingType")


def unsupported_reason(n: int, k: int, block: tuple[int, int], device: torch.device,
                       out_dtype: torch.dtype) -> str | None:
    """Why this call cannot go to ``torch._scaled_mm`` block-wise, or None if it can."""
    if device.type != "cuda":
        return f"block-wise torch._scaled_mm needs an sm_90 GPU, not {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"block-wise torch._scaled_mm is an sm_90 recipe, not sm_{major}{minor}"
    if n % GROUP or k % GROUP or tuple(block) != (GROUP, GROUP):
        return f"N={n} and K={k} must be multiples of 128 and the weight block (128, 128)"
    if out_dtype != torch.bfloat16:
        return f"block-wise torch._scaled_mm writes bf16, not {out_dtype}"
    return None


def prepare_scales(x_scale: torch.Tensor, weight_scale: torch.Tensor, v2: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale_a, scale_b) in the layouts ``torch._scaled_mm`` wants (module docstring) from
    ``x_scale`` [M, K/128] and ``weight_scale`` [N/128, K/128], both fp32 multipliers."""
    m, kb = x_scale.shape
    # [M, K/128] with stride (1, M) spelled out: torch checks the strides literally, also the
    # one of a size-1 dimension, which .t().contiguous().t() would leave at K/128 when M = 1
    scale_a = torch.empty_strided((m, kb), (1, m), dtype=torch.float32, device=x_scale.device)
    scale_a.copy_(x_scale)
    l4 = -(-kb // 4) * 4
    padded = torch.zeros(weight_scale.shape[0], l4, dtype=torch.float32,
                         device=weight_scale.device)
    padded[:, :kb] = weight_scale
    scale_b = padded.t() if v2 else padded[:, :kb].t()  # [L4 | K/128, N/128], stride (1, L4)
    return scale_a, scale_b


def scaled_mm_fp8(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                  weight_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """``xq @ weight.T`` through ``torch._scaled_mm`` (+ residual after rounding).

    Args:
        xq: [M, K] E4M3, row-major.  x_scale: [M, K/128] fp32.
        weight: [N, K] E4M3, row-major.  weight_scale: [N/128, K/128] fp32.
    Returns:
        [M, N] in ``out_dtype``.
    """
    m = xq.shape[0]
    if m % 4:
        m4 = m + 4 - m % 4
        padded = torch.zeros(m4, xq.shape[1], dtype=xq.dtype, device=xq.device)
        padded[:m] = xq
        xq = padded
        x_scale = torch.cat([x_scale, x_scale.new_ones(m4 - m, x_scale.shape[1])])
    v2 = has_v2()
    scale_a, scale_b = prepare_scales(x_scale, weight_scale, v2)
    if v2:
        y = F.scaled_mm(xq, weight.t(), scale_a, F.ScalingType.BlockWise1x128, scale_b,
                        F.ScalingType.BlockWise128x128, output_dtype=out_dtype)
    else:
        y = torch._scaled_mm(xq, weight.t(), scale_a, scale_b, out_dtype=out_dtype)
    y = y[:m]
    # torch adds low-precision tensors in fp32 and rounds once: (y + r) as finish_tile rounds it
    return y if residual is None else y.add_(residual)
