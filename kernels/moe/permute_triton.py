"""Quantise x straight into the expert-aligned row order (DeepGEMM's contiguous layout).

``gather_quant`` writes, for every aligned row r below the device-side ``num_padded``, the
per-token-group E4M3 quantisation of token ``sorted_ids[r] // A`` (``quant_triton``'s arithmetic,
bit for bit) and zeros for pad slots. With it the gate_up GEMM reads A through TMA like the down
GEMM (and Triton's Hopper warp specialisation, which needs TMA operands, can split its loop);
the price is T*A instead of T quantised rows (each token once per chosen expert). One launch,
like the plain quantisation it replaces. Knows nothing about weights or tiles beyond the rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmlab.kernels.fp8 import interpret_casts
from glmlab.kernels.fp8.quant_triton import INV_FP8_MAX, group_scale
from glmlab.kernels.fp8.ref import FP8, FP8_MAX
from glmlab.kernels.moe.routing_triton import AlignedPairs


@triton.jit(do_not_specialize=["num_pairs"])
def _gather_quant_kernel(x_ptr, q_ptr, s_ptr, sorted_ids_ptr, num_padded_ptr, num_pairs, top_k,
                         K, num_groups, stride_x, stride_q, stride_s,
                         FP8_MAX_C: tl.constexpr, INV_FP8_MAX_C: tl.constexpr,
                         GROUP: tl.constexpr, ROWS: tl.constexpr, PRECISE: tl.constexpr):
    # A program takes ROWS aligned rows x one 128-channel group: [ROWS, GROUP] tiles.
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1)
    num_rows = tl.load(num_padded_ptr)
    if tl.program_id(0) * ROWS >= num_rows:
        return
    row_in = r < num_rows
    pair = tl.load(sorted_ids_ptr + r, mask=row_in, other=num_pairs)
    valid = pair < num_pairs
    tok = (pair // top_k).to(tl.int64)
    cols = g * GROUP + tl.arange(0, GROUP)
    x = tl.load(x_ptr + tok[:, None] * stride_x + cols[None, :], mask=valid[:, None],
                other=0.0).to(tl.float32)
    scale = group_scale(tl.max(tl.abs(x), axis=1), FP8_MAX_C, INV_FP8_MAX_C, ROWS, PRECISE)
    q = tl.math.div_rn(x, scale[:, None] + tl.zeros_like(x))  # div_rn does not broadcast
    q = tl.minimum(tl.maximum(q, -FP8_MAX_C), FP8_MAX_C)
    r64 = r.to(tl.int64)
    tl.store(q_ptr + r64[:, None] * stride_q + cols[None, :], q.to(q_ptr.dtype.element_ty),
             mask=row_in[:, None])
    tl.store(s_ptr + r64 * stride_s + g, scale, mask=row_in)


def gather_quant(x: torch.Tensor, align: AlignedPairs, group: int = 128
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D] (any float dtype) -> (E4M3 [max_rows, D], fp32 scales [max_rows, D/group]) in
    aligned row order; pad rows are zeros (scale ``1e-12 / 448``), rows past ``num_padded``
    unwritten. Row r equals ``quant_act_fp8(x)`` of token ``sorted_ids[r] // A``."""
    if not x.is_cuda:
        interpret_casts.install()
    x = x.contiguous()
    t, d = x.shape
    if d % group:
        raise ValueError(f"hidden size {d} must be a multiple of the quant group {group}")
    q = torch.empty(align.max_rows, d, dtype=FP8, device=x.device)
    s = torch.empty(align.max_rows, d // group, dtype=torch.float32, device=x.device)
    rows = 16
    grid = (triton.cdiv(align.max_rows, rows), d // group)
    _gather_quant_kernel[grid](x, q, s, align.sorted_ids, align.num_padded, align.num_pairs,
                               align.top_k, d, d // group, x.stride(0), q.stride(0), s.stride(0),
                               FP8_MAX_C=FP8_MAX, INV_FP8_MAX_C=INV_FP8_MAX, GROUP=group,
                               ROWS=rows, PRECISE=x.is_cuda, num_warps=4)
    return q, s
