"""Triton per-token-group FP8 activation quantisation (the ``quant_act_fp8`` recipe of ref.py).

One scale per token per ``group`` channels: ``scale = max(absmax, 1e-12) / 448`` and
``q = clamp(x / scale, -448, 448)`` rounded to E4M3, computed exactly as the torch reference
computes it on the same device, so the two are bit-equal: ``x / scale`` is an IEEE division
(``div_rn``) everywhere, while ``absmax / 448`` is a division on the CPU but ``absmax * fl(1/448)``
on CUDA, where torch turns a division by a Python scalar into a multiplication by its fp32
reciprocal (``div_true_kernel_cuda``). Rows at or past ``*num_rows`` (a device
scalar, e.g. the padded row count of an MoE alignment) are skipped, so the launch grid can be
sized on the host without a device sync. Knows nothing about what the rows mean.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from glmlab.kernels.fp8 import interpret_casts
from glmlab.kernels.fp8.ref import FP8, FP8_MAX


@triton.jit
def _quant_act_kernel(x_ptr, q_ptr, s_ptr, num_rows_ptr, K, num_groups, total_rows,
                      stride_x, stride_q, stride_s, FP8_MAX_C: tl.constexpr,
                      INV_FP8_MAX_C: tl.constexpr, GROUP: tl.constexpr, UNITS: tl.constexpr,
                      HAS_NUM_ROWS: tl.constexpr, SCALE_BY_RECIPROCAL: tl.constexpr):
    # A program takes UNITS (row, group) units, row-major: [UNITS, GROUP] tiles.
    unit = tl.program_id(0) * UNITS + tl.arange(0, UNITS)
    row = unit // num_groups
    if HAS_NUM_ROWS:
        num_rows = tl.minimum(tl.load(num_rows_ptr), total_rows)
    else:
        num_rows = total_rows
    if tl.program_id(0) * UNITS // num_groups >= num_rows:
        return
    g = unit % num_groups
    cols = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # [UNITS, GROUP]
    row_ok = row < num_rows
    ok = (cols < K) & row_ok[:, None]
    row64 = row.to(tl.int64)[:, None]
    x = tl.load(x_ptr + row64 * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    scale = group_scale(amax, FP8_MAX_C, INV_FP8_MAX_C, UNITS, SCALE_BY_RECIPROCAL)
    q = tl.math.div_rn(x, scale[:, None] + tl.zeros_like(x))  # div_rn does not broadcast
    q = tl.minimum(tl.maximum(q, -FP8_MAX_C), FP8_MAX_C)
    tl.store(q_ptr + row64 * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row.to(tl.int64) * stride_s + g, scale, mask=row_ok)


@triton.jit
def group_scale(amax, FP8_MAX_C: tl.constexpr, INV_FP8_MAX_C: tl.constexpr, N: tl.constexpr,
                SCALE_BY_RECIPROCAL: tl.constexpr):
    """max(amax, 1e-12) / 448 as torch computes it on this device (see the module docstring)."""
    amax = tl.maximum(amax, 1e-12)
    if SCALE_BY_RECIPROCAL:
        return amax * INV_FP8_MAX_C
    return tl.math.div_rn(amax, tl.full([N], FP8_MAX_C, tl.float32))


# torch's fp32 reciprocal of 448 (rounded once, to fp32): the constant CUDA multiplies by.
INV_FP8_MAX = float(np.float32(1.0) / np.float32(FP8_MAX))


def quant_act_fp8_triton(x: torch.Tensor, group: int = 128, num_rows: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group FP8 quantisation.

    Args:
        x: [T, K] activations (any float dtype), last dim contiguous.
        group: channels per scale (128 for the block-FP8 recipe).
        num_rows: optional int32 device scalar; rows ``>= num_rows`` are left unwritten.
    Returns:
        q [T, K] float8_e4m3fn and scale [T, ceil(K / group)] fp32 (a multiplier: x ~ q * scale).

    Example:
        >>> q, s = quant_act_fp8_triton(torch.randn(4, 256, device="cuda"))
    """
    if not x.is_cuda:
        interpret_casts.install()
    t, k = x.shape
    num_groups = triton.cdiv(k, group)
    q = torch.empty(t, k, dtype=FP8, device=x.device)
    s = torch.empty(t, num_groups, dtype=torch.float32, device=x.device)
    if t == 0:
        return q, s
    units = 16
    grid = (triton.cdiv(t * num_groups, units),)
    _quant_act_kernel[grid](x, q, s, num_rows if num_rows is not None else s, k, num_groups, t,
                            x.stride(0), q.stride(0), s.stride(0), FP8_MAX_C=FP8_MAX,
                            INV_FP8_MAX_C=INV_FP8_MAX, GROUP=group, UNITS=units,
                            HAS_NUM_ROWS=num_rows is not None, SCALE_BY_RECIPROCAL=x.is_cuda,
                            num_warps=4)
    return q, s
