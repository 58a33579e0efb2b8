"""Triton routing for the MoE: top-k selection with the correction bias, and pair alignment.

``route_topk`` is ``ref.route_ref`` as one kernel: fp32 sigmoid of the router logits, the
``e_score_correction_bias`` added for *selection only*, top-k by repeated argmax (ties go to the
lower expert id), the unbiased scores of the winners renormalised and scaled.

``align_pairs`` is ``ref.moe_align_ref``: the (token, slot) pairs are sorted by expert (token
order kept inside an expert) and each expert's run is padded to a multiple of ``block_m``, so that
every row block of the grouped GEMMs belongs to one expert. Two launches of E programs each: count,
then scatter. Every program scans all pairs (E x T*A compares: 19M at M = 8192, E = 288, a few
microseconds from L2) and the result is deterministic, unlike an atomics-based scatter. The number
of padded rows stays on the device, so the GEMM grids are sized by the host bound
``T*A + min(E, T*A) * (block_m - 1)`` and programs past the real count exit at once.

Neither function knows about weights or GEMM tiles beyond ``block_m``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, T, E, scaling, stride_l,
                  TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr,
                  BLOCK_T: tl.constexpr, RENORMALIZE: tl.constexpr, PRECISE: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    cols = tl.arange(0, E_PAD)
    row_ok = rows < T
    col_ok = cols < E
    x = tl.load(logits_ptr + rows[:, None].to(tl.int64) * stride_l + cols[None, :],
                mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
    one = tl.full([BLOCK_T, E_PAD], 1.0, tl.float32)
    if PRECISE:  # torch's CUDA sigmoid: 1 / (1 + expf(-x)), IEEE division
        s = tl.math.div_rn(one, one + libdevice.exp(-x))
    else:
        s = tl.math.div_rn(one, one + tl.exp(-x))
    bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    select = tl.where(col_ok[None, :], s + bias[None, :], float("-inf"))  # [BLOCK_T, E_PAD]
    slots = tl.arange(0, K_PAD)
    chosen_w = tl.zeros([BLOCK_T, K_PAD], dtype=tl.float32)
    chosen_id = tl.zeros([BLOCK_T, K_PAD], dtype=tl.int32)
    total = tl.zeros([BLOCK_T], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        best = tl.argmax(select, axis=1).to(tl.int32)  # [BLOCK_T]
        hit = cols[None, :] == best[:, None]
        w = tl.sum(tl.where(hit, s, 0.0), axis=1)
        chosen_w = tl.where(slots[None, :] == k, w[:, None], chosen_w)
        chosen_id = tl.where(slots[None, :] == k, best[:, None], chosen_id)
        total += w
        select = tl.where(hit, float("-inf"), select)
    if RENORMALIZE:
        chosen_w = chosen_w / (total[:, None] + 1e-20)
    chosen_w = chosen_w * scaling
    out = rows[:, None] * TOP_K + slots[None, :]
    ok = row_ok[:, None] & (slots[None, :] < TOP_K)
    tl.store(w_ptr + out, chosen_w, mask=ok)
    tl.store(ids_ptr + out, chosen_id, mask=ok)


def route_topk(logits: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float,
               renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid top-k routing (``ref.route_ref`` in one kernel).

    Args:
        logits: [T, E] router logits (fp32 preferred).  bias: [E] e_score_correction_bias.
        top_k: experts per token (A).  scaling: routed_scaling_factor (2.5 for GLM-5.3-Flash).
    Returns:
        weights [T, A] fp32 and ids [T, A] int32, slot 0 the highest biased score.
    """
    t, e = logits.shape
    weights = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=logits.device)
    if t == 0:
        return weights, ids
    e_pad = triton.next_power_of_2(e)
    block_t = max(1, min(16, 4096 // e_pad))
    _route_kernel[(triton.cdiv(t, block_t),)](
        logits, bias, weights, ids, t, e, float(scaling), logits.stride(0), TOP_K=top_k,
        K_PAD=triton.next_power_of_2(top_k), E_PAD=e_pad, BLOCK_T=block_t,
        RENORMALIZE=renormalize, PRECISE=logits.is_cuda, num_warps=4)
    return weights, ids


# ---- alignment ----

@dataclass(frozen=True)
class AlignedPairs:
    """Pairs sorted by expert, padded per expert to ``block_m`` rows (see ``ref.moe_align_ref``).

    ``sorted_ids`` [max_rows] int32: pair index ``t * A + a`` or ``num_pairs`` in pad slots;
    ``expert_ids`` [max_rows / block_m] int32; ``num_padded`` [1] int32 (device); entries past
    ``num_padded`` are unwritten. ``max_rows`` is the host-side bound the grids are sized by.
    """

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_padded: torch.Tensor
    num_pairs: int
    top_k: int
    block_m: int
    max_rows: int

    @property
    def num_row_blocks(self) -> int:
        return self.max_rows // self.block_m


@triton.jit(do_not_specialize=["num_pairs"])
def _count_kernel(ids_ptr, counts_ptr, num_pairs, CHUNK: tl.constexpr):
    e = tl.program_id(0)
    acc = tl.zeros([CHUNK], dtype=tl.int32)
    for start in range(0, num_pairs, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        v = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1)
        acc += (v == e).to(tl.int32)
    tl.store(counts_ptr + e, tl.sum(acc, axis=0))


@triton.jit(do_not_specialize=["num_pairs"])
def _scatter_kernel(ids_ptr, counts_ptr, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
                    num_pairs, num_experts, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr,
                    CHUNK: tl.constexpr):
    e = tl.program_id(0)
    experts = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + experts, mask=experts < num_experts, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    start = tl.sum(tl.where(experts < e, padded, 0), axis=0)
    count = tl.sum(tl.where(experts == e, counts, 0), axis=0)
    my_padded = tl.sum(tl.where(experts == e, padded, 0), axis=0)
    if e == 0:
        tl.store(num_padded_ptr, tl.sum(padded, axis=0))
    if count > 0:
        for b in range(0, my_padded // BLOCK_M):
            tl.store(expert_ids_ptr + start // BLOCK_M + b, e)
        pad = tl.arange(0, BLOCK_M)
        tl.store(sorted_ids_ptr + start + count + pad, num_pairs + pad * 0,
                 mask=pad < my_padded - count)
        written = count * 0
        for s0 in range(0, num_pairs, CHUNK):
            offs = s0 + tl.arange(0, CHUNK)
            v = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1)
            hit = (v == e).to(tl.int32)
            pos = start + written + tl.cumsum(hit, axis=0) - 1
            tl.store(sorted_ids_ptr + pos, offs, mask=hit > 0)
            written += tl.sum(hit, axis=0)


def max_padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Host bound on the padded row count: every non-empty expert wastes < block_m rows."""
    rows = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return triton.cdiv(rows, block_m) * block_m


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedPairs:
    """Sort (token, slot) pairs by expert, padding each expert to a multiple of ``block_m``.

    Args:
        ids: [T, A] expert ids (int32 or int64); ids outside [0, E) are skipped (EP: other ranks).
        num_experts: E, the experts this rank holds.  block_m: the GEMMs' BLOCK_SIZE_M.
    Returns:
        ``AlignedPairs`` (device tensors; nothing is synchronised).
    """
    t, top_k = ids.shape
    num_pairs = t * top_k
    flat = ids.reshape(-1).to(torch.int32)
    max_rows = max(max_padded_rows(num_pairs, num_experts, block_m), block_m)
    dev = ids.device
    sorted_ids = torch.empty(max_rows, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(max_rows // block_m, dtype=torch.int32, device=dev)
    num_padded = torch.zeros(1, dtype=torch.int32, device=dev)
    counts = torch.empty(num_experts, dtype=torch.int32, device=dev)
    if num_pairs > 0:
        chunk = min(1024, max(16, triton.next_power_of_2(num_pairs)))
        _count_kernel[(num_experts,)](flat, counts, num_pairs, CHUNK=chunk, num_warps=4)
        _scatter_kernel[(num_experts,)](flat, counts, sorted_ids, expert_ids, num_padded,
                                        num_pairs, num_experts, BLOCK_M=block_m,
                                        E_PAD=triton.next_power_of_2(num_experts), CHUNK=chunk,
                                        num_warps=4)
    return AlignedPairs(sorted_ids, expert_ids, num_padded, num_pairs, top_k, block_m, max_rows)
