"""Triton kernels between and after the MoE GEMMs: clamped SwiGLU (+ FP8 requantisation), combine.

``swiglu_quant`` is the fused activation of the block-FP8 path: it reads a gate_up row once and
writes E4M3 values plus one fp32 scale per 128 channels, the layout the down GEMM reads. It is
bit-equal on a GPU to the *unfused* path (``ref.swiglu_quant_ref``: torch's clamped SwiGLU in the
activation dtype, then per-group quantisation) because it repeats that path's roundings:
``silu`` = g / (1 + expf(-g)) in fp32 with IEEE division (torch's CUDA silu), rounded to the
activation dtype; times the clamped up, rounded again; absmax, scale and quotient as torch's
``quant_act_fp8`` computes them on the same device (``fp8.quant_triton``). The activation
is therefore rounded to BF16 *before* the absmax, as the unfused kernel pair sees it.
``swiglu`` is the same kernel without quantisation (the plain path and the unfused baseline).

``combine`` sums the A weighted slot outputs of each token in fp32 (slot order, deterministic),
skipping slots whose expert id is outside [0, E) (another EP rank's expert).

Rows at or past ``*num_rows`` (the aligned row count) are skipped. These kernels know nothing
about experts, tiles or configs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from glmlab.kernels.fp8 import interpret_casts
from glmlab.kernels.fp8.quant_triton import INV_FP8_MAX, group_scale
from glmlab.kernels.fp8.ref import FP8, FP8_MAX


@triton.jit
def _swiglu_kernel(h_ptr, y_ptr, q_ptr, s_ptr, num_rows_ptr, I, num_groups, limit,
                   stride_h, stride_y, stride_s,
                   QUANT: tl.constexpr, FP8_MAX_C: tl.constexpr, INV_FP8_MAX_C: tl.constexpr,
                   GROUP: tl.constexpr, UNITS: tl.constexpr, PRECISE: tl.constexpr):
    # A program takes UNITS (row, 128-channel group) units, row-major: [UNITS, GROUP] tiles.
    unit = tl.program_id(0) * UNITS + tl.arange(0, UNITS)
    row = unit // num_groups
    num_rows = tl.load(num_rows_ptr)
    if tl.program_id(0) * UNITS // num_groups >= num_rows:
        return
    g = unit % num_groups
    cols = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # [UNITS, GROUP]
    row_ok = row < num_rows
    ok = (cols < I) & row_ok[:, None]
    row64 = row.to(tl.int64)[:, None]
    gate = tl.load(h_ptr + row64 * stride_h + cols, mask=ok, other=0.0)
    up = tl.load(h_ptr + row64 * stride_h + I + cols, mask=ok, other=0.0)
    act_dtype = gate.dtype
    gate = tl.minimum(gate.to(tl.float32), limit)  # clamps are exact in any float format
    up = tl.minimum(tl.maximum(up.to(tl.float32), -limit), limit)
    if PRECISE:  # torch's CUDA silu: x / (1 + expf(-x)) with accurate expf and IEEE division
        e = libdevice.exp(-gate)
    else:
        e = tl.exp(-gate)
    silu = tl.math.div_rn(gate, 1.0 + e).to(act_dtype).to(tl.float32)
    y = (silu * up).to(act_dtype)  # the product of two bf16 is exact in fp32: one rounding
    if QUANT:
        yf = y.to(tl.float32)
        amax = tl.max(tl.abs(yf), axis=1)  # [UNITS]
        # as torch on this device (fp8.quant_triton): CUDA multiplies by fl(1/448)
        scale = group_scale(amax, FP8_MAX_C, INV_FP8_MAX_C, UNITS, PRECISE)
        q = tl.math.div_rn(yf, scale[:, None] + tl.zeros_like(yf))  # div_rn does not broadcast
        q = tl.minimum(tl.maximum(q, -FP8_MAX_C), FP8_MAX_C)
        tl.store(q_ptr + row64 * stride_y + cols, q.to(q_ptr.dtype.element_ty), mask=ok)
        tl.store(s_ptr + row.to(tl.int64) * stride_s + g, scale, mask=row_ok)
    else:
        tl.store(y_ptr + row64 * stride_y + cols, y, mask=ok)


_UNITS = 16  # (row, group) units per program: 16 x 128 channels


def _launch_swiglu(h, limit, num_rows, quant: bool, group: int, units: int = _UNITS):
    if not h.is_cuda:
        interpret_casts.install()
    rows, two_i = h.shape
    inter = two_i // 2
    num_groups = triton.cdiv(inter, group)
    y = torch.empty(rows, inter, dtype=FP8 if quant else h.dtype, device=h.device)
    s = torch.empty(rows, num_groups, dtype=torch.float32, device=h.device) if quant else y
    if num_rows is None:
        num_rows = torch.full((1,), rows, dtype=torch.int32, device=h.device)
    if rows:
        grid = (triton.cdiv(rows * num_groups, units),)
        _swiglu_kernel[grid](h, y, y, s, num_rows, inter, num_groups, float(limit), h.stride(0),
                             y.stride(0), s.stride(0), QUANT=quant, FP8_MAX_C=FP8_MAX,
                             INV_FP8_MAX_C=INV_FP8_MAX, GROUP=group, UNITS=units,
                             PRECISE=h.is_cuda, num_warps=4 if units <= 16 else 8)
    return y, s


def swiglu_quant(h: torch.Tensor, limit: float, num_rows: torch.Tensor | None = None,
                 group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused clamped SwiGLU + per-token-group FP8 quantisation (``ref.swiglu_quant_ref``).

    Args:
        h: [R, 2I] gate_up output in the activation dtype (bf16 in production), gate then up.
        limit: swiglu_limit (10.0).  num_rows: int32 device scalar; rows >= it are unwritten.
    Returns:
        E4M3 [R, I] and fp32 scales [R, ceil(I / group)].
    """
    return _launch_swiglu(h, limit, num_rows, True, group)


def swiglu(h: torch.Tensor, limit: float, num_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Clamped SwiGLU in ``h.dtype`` ([R, 2I] -> [R, I]); ``ref.clamped_swiglu`` on the halves."""
    return _launch_swiglu(h, limit, num_rows, False, 128)[0]


@triton.jit
def _combine_kernel(pair_ptr, ids_ptr, out_ptr, D, num_experts,
                    TOP_K: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for a in tl.static_range(TOP_K):
        e = tl.load(ids_ptr + t * TOP_K + a)
        use = (e >= 0) & (e < num_experts)
        v = tl.load(pair_ptr + (t * TOP_K + a) * D + d, mask=d_ok & use, other=0.0)
        acc += v.to(tl.float32)
    tl.store(out_ptr + t * D + d, acc.to(out_ptr.dtype.element_ty), mask=d_ok)


def combine(pair_out: torch.Tensor, ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Sum each token's weighted slot outputs.

    Args:
        pair_out: [T * A, D] (row ``t * A + a``), contiguous.  ids: [T, A] expert ids.
    Returns:
        [T, D] in pair_out.dtype; slots with ids outside [0, E) are skipped (never read).
    """
    t, top_k = ids.shape
    d = pair_out.shape[1]
    out = torch.empty(t, d, dtype=pair_out.dtype, device=pair_out.device)
    if t:
        block_d = min(1024, triton.next_power_of_2(d))
        _combine_kernel[(t, triton.cdiv(d, block_d))](pair_out, ids.contiguous(), out, d,
                                                      num_experts, TOP_K=top_k, BLOCK_D=block_d,
                                                      num_warps=4)
    return out
