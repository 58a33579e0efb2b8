"""RMSNorm in Triton, optionally after a residual add: one read of each row, one or two writes.

``rmsnorm(x, weight, eps, residual)`` is ``ref.rmsnorm_ref``: s = x (+ residual, rounded to the
row dtype), h = weight * to_dtype(s * rsqrt(mean(s^2) + eps)) with the maths in fp32 and the cast
back *before* the weight multiply (transformers' GLM RMSNorm). Rows may be strided (a column
slice of a fused projection's output). One program per row; the whole row sits in registers.
Knows nothing about where the rows come from.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, s_ptr, D, stride_x, stride_r, stride_h, eps,
                    HAS_RES: tl.constexpr, BD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BD)
    ok = d < D
    x = tl.load(x_ptr + row * stride_x + d, mask=ok, other=0.0)
    act = x.dtype
    if HAS_RES:
        x = (x.to(tl.float32) + tl.load(r_ptr + row * stride_r + d, mask=ok,
                                        other=0.0).to(tl.float32)).to(act)
        tl.store(s_ptr + row * D + d, x, mask=ok)
    xf = x.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    w = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)
    tl.store(h_ptr + row * stride_h + d,
             (w * (xf * r).to(act).to(tl.float32)).to(h_ptr.dtype.element_ty), mask=ok)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float,
            residual: torch.Tensor | None = None,
            out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, s): RMSNorm of s = x (+ residual) and s itself (x when there is no residual).

    Args:
        x: [T, D] (last dim contiguous, rows may be strided).  weight: [D].
        residual: [T, D] added first, in x.dtype.  out: optional [T, D] destination for h.
    """
    t, d = x.shape
    if x.stride(-1) != 1 or weight.shape != (d,):
        raise ValueError(f"x must have a contiguous last dim and weight [{d}]")
    if residual is not None and (residual.shape != x.shape or residual.stride(-1) != 1):
        raise ValueError(f"residual must be [{t}, {d}] with a contiguous last dim")
    h = out if out is not None else torch.empty(t, d, dtype=x.dtype, device=x.device)
    s = torch.empty(t, d, dtype=x.dtype, device=x.device) if residual is not None else x
    if t:
        bd = triton.next_power_of_2(d)
        _rmsnorm_kernel[(t,)](x, residual if residual is not None else x, weight, h, s, d,
                              x.stride(0), residual.stride(0) if residual is not None else 0,
                              h.stride(0), float(eps), HAS_RES=residual is not None, BD=bd,
                              num_warps=4 if bd <= 2048 else 8)
    return h, s
