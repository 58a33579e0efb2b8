"""The DSA k-pool indexer of a uniform step in Triton, through the page table, at fixed width.

Three launches, each with a grid fixed by host-known sizes (sequences, tokens, the page table's
width), every per-sequence length read on the device from ``positions``:

1. ``pool_update``: one program per sequence appends its n new (key, gate) rows to the request's
   incomplete-pool tail and compresses every pool the step completes (softmax over the pool's
   tokens of gate + ape, as ``dsa.ref.pool_keys_ref``; E4M3 + per-pool scale when the cache keeps
   FP8 keys, as ``quantize_pool_keys_ref``), writing it at the pool's slot.
2. ``pool_scores``: per (token, block of pools), I(t, p) = sum_h w[t, h] relu(q[t, h] . K_p *
   scale) over the complete pools (last token <= t); blocks past a token's pools, and tokens with
   no more pools than the top-k (they keep them all), exit at once.
3. ``select_slots``: per token, the top ``topk_pools`` pools by an exact radix threshold on the
   order-preserving integer image of the scores (ties to the lower pool id), compacted in pool
   order, expanded to their kpool positions, plus the tail ((t+1) mod kpool newest positions), all
   mapped through the page table to token slots, -1 padded to the fixed width topk*kpool+kpool-1.

Equal as sets to ``ref.index_select_ref`` / the model's per-sequence indexer. Knows nothing about
attention or the projections that produced q, k, the gates and weights.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmlab.kernels.fp8 import interpret_casts


@triton.jit
def _pool_update_kernel(k_ptr, gate_ptr, tail_ptr, keys_ptr, kscale_ptr, ape_ptr, slots_ptr,
                        pos_ptr, pt_ptr, n, S, stride_k, stride_g, stride_ts, stride_pt,
                        KPOOL: tl.constexpr, DI: tl.constexpr, FP8_KEYS: tl.constexpr):
    seq = tl.program_id(0)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    start = tl.load(pos_ptr + seq * n)
    held = start % KPOOL
    done = (held + n) // KPOOL
    r, d = tl.arange(0, KPOOL), tl.arange(0, DI)
    tail = tail_ptr + slot * stride_ts
    kdt = k_ptr.dtype.element_ty
    ape = tl.load(ape_ptr + r[:, None] * DI + d[None, :]).to(tl.float32)
    for p in range(done):
        j = p * KPOOL + r  # row of [held tail rows | n new rows]
        old = j < held
        tok = (seq * n + j - held).to(tl.int64)
        key = tl.where(old[:, None],
                       tl.load(tail + j[:, None] * (2 * DI) + d[None, :], mask=old[:, None],
                               other=0.0).to(kdt),
                       tl.load(k_ptr + tok[:, None] * stride_k + d[None, :], mask=~old[:, None],
                               other=0.0))
        gl = tl.where(old[:, None],
                      tl.load(tail + j[:, None] * (2 * DI) + DI + d[None, :], mask=old[:, None],
                              other=0.0).to(kdt).to(tl.float32),
                      tl.load(gate_ptr + tok[:, None] * stride_g + d[None, :],
                              mask=~old[:, None], other=0.0).to(tl.float32)) + ape
        e = tl.exp(gl - tl.max(gl, axis=0)[None, :])
        prob = (e / tl.sum(e, axis=0)[None, :]).to(kdt)
        pooled = tl.sum((prob.to(tl.float32) * key.to(tl.float32)).to(kdt).to(tl.float32),
                        axis=0).to(kdt)
        first = start - held + p * KPOOL  # position of the pool's first token
        pool_slot = (tl.load(pt_ptr + seq * stride_pt + first // S).to(tl.int64) * S
                     + first % S) // KPOOL
        if FP8_KEYS:
            pf = pooled.to(tl.float32)
            scale = tl.max(tl.abs(pf), axis=0) / 448.0
            safe = tl.where(scale > 0, scale, 1.0)
            qk = tl.math.div_rn(pf, tl.zeros_like(pf) + safe)
            qk = tl.minimum(tl.maximum(qk, -448.0), 448.0)
            tl.store(keys_ptr + pool_slot * DI + d, qk.to(keys_ptr.dtype.element_ty))
            tl.store(kscale_ptr + pool_slot, scale)
        else:
            tl.store(keys_ptr + pool_slot * DI + d, pooled.to(keys_ptr.dtype.element_ty))
    tl.debug_barrier()  # the tail rows above were read before the new rows overwrite them
    td = tail_ptr.dtype.element_ty
    for j in range(tl.maximum(done * KPOOL, held), held + n):  # held rows stay where they are
        tok = (seq * n + j - held).to(tl.int64)
        dst = tail + (j - done * KPOOL) * (2 * DI)
        tl.store(dst + d, tl.load(k_ptr + tok * stride_k + d).to(td))
        tl.store(dst + DI + d, tl.load(gate_ptr + tok * stride_g + d).to(td))


@triton.jit
def _scores_kernel(q_ptr, w_ptr, keys_ptr, kscale_ptr, pos_ptr, pt_ptr, out_ptr, n, S,
                   stride_qt, stride_qh, stride_w, stride_pt, stride_o, softmax_scale,
                   HI: tl.constexpr, HP: tl.constexpr, DI: tl.constexpr, KPOOL: tl.constexpr,
                   TOPK: tl.constexpr, BP: tl.constexpr, FP8_KEYS: tl.constexpr,
                   DOT_FP32: tl.constexpr):
    t, pb = tl.program_id(0).to(tl.int64), tl.program_id(1)
    num_pools = (tl.load(pos_ptr + t) + 1) // KPOOL
    if num_pools <= TOPK or pb * BP >= num_pools:
        return  # keeps every pool (no scores needed), or no pools in this block
    seq = t // n
    p = pb * BP + tl.arange(0, BP)
    p_ok = p < num_pools
    first = p * KPOOL
    pool_slot = (tl.load(pt_ptr + seq * stride_pt + first // S, mask=p_ok, other=0).to(tl.int64)
                 * S + first % S) // KPOOL
    h, d = tl.arange(0, HP), tl.arange(0, DI)  # heads padded to the dot's 16-row minimum
    q = tl.load(q_ptr + t * stride_qt + h[:, None] * stride_qh + d[None, :],
                mask=(h < HI)[:, None], other=0.0)  # [HP, DI]
    keys = tl.load(keys_ptr + pool_slot[:, None] * DI + d[None, :], mask=p_ok[:, None],
                   other=0.0)  # [BP, DI]
    if DOT_FP32:
        s = tl.dot(q.to(tl.float32), tl.trans(keys.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(keys.to(q.dtype)))  # e4m3 / bf16 keys are exact in bf16
    scale = softmax_scale
    if FP8_KEYS:
        s = s * tl.load(kscale_ptr + pool_slot, mask=p_ok, other=0.0)[None, :]
    w = tl.load(w_ptr + t * stride_w + h, mask=h < HI, other=0.0).to(tl.float32)
    score = tl.sum(w[:, None] * tl.maximum(s * scale, 0.0), axis=0)  # [BP]
    tl.store(out_ptr + t * stride_o + p, score, mask=p_ok)


@triton.jit
def _order_key(x):
    """fp32 -> int32 with the same order (flip the magnitude bits of negatives)."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _count_at_least(row_ptr, num, thr, BP: tl.constexpr):
    c = tl.zeros([], tl.int32)
    for s in range(0, num, BP):
        offs = s + tl.arange(0, BP)
        key = _order_key(tl.load(row_ptr + offs, mask=offs < num, other=0.0))
        c += tl.sum(((key >= thr) & (offs < num)).to(tl.int32), axis=0)
    return c


@triton.jit
def _select_kernel(score_ptr, pos_ptr, pt_ptr, out_ptr, n, S, stride_s, stride_pt, stride_o,
                   KPOOL: tl.constexpr, TOPK: tl.constexpr, TAIL: tl.constexpr,
                   BP: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    seq = t // n
    pos = tl.load(pos_ptr + t)
    num_pools = (pos + 1) // KPOOL
    row = score_ptr + t * stride_s
    o = out_ptr + t * stride_o
    page_row = pt_ptr + seq * stride_pt
    if num_pools <= TOPK:  # every complete pool
        thr = tl.full([], -(2**31), tl.int32)
        need_eq = tl.zeros([], tl.int32)
    else:  # the TOPK-th largest key: largest thr with >= TOPK keys at or above it
        lo = tl.full([], -(2**31), tl.int64)
        hi = tl.full([], 2**31 - 1, tl.int64)
        for _ in range(32):
            mid = lo + (hi - lo + 1) // 2
            enough = _count_at_least(row, num_pools, mid.to(tl.int32), BP) >= TOPK
            lo = tl.where(enough, mid, lo)
            hi = tl.where(enough, hi, mid - 1)
        thr = lo.to(tl.int32)
        need_eq = TOPK - _count_at_least(row, num_pools, thr + 1, BP)
    taken = tl.zeros([], tl.int32)
    eq_seen = tl.zeros([], tl.int32)
    for s0 in range(0, num_pools, BP):
        p = s0 + tl.arange(0, BP)
        inside = p < num_pools
        if num_pools <= TOPK:
            sel = inside
        else:
            key = _order_key(tl.load(row + p, mask=inside, other=0.0))
            eq = (key == thr) & inside
            rank = eq_seen + tl.cumsum(eq.to(tl.int32), axis=0) - 1
            sel = ((key > thr) & inside) | (eq & (rank < need_eq))
            eq_seen += tl.sum(eq.to(tl.int32), axis=0)
        at = taken + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        first = p * KPOOL
        base = tl.load(page_row + first // S, mask=sel, other=0) * S + first % S
        for j in tl.static_range(KPOOL):
            tl.store(o + at * KPOOL + j, (base + j).to(tl.int32), mask=sel)
        taken += tl.sum(sel.to(tl.int32), axis=0)
    for c0 in range(0, TOPK * KPOOL, BP):  # -1 after the selected pools' tokens
        c = c0 + tl.arange(0, BP)
        tl.store(o + c, tl.full([BP], -1, tl.int32), mask=(c >= taken * KPOOL) & (c < TOPK * KPOOL))
    if TAIL:
        tail_len = (pos + 1) % KPOOL
        j = tl.arange(0, KPOOL)
        tp = pos + 1 - tail_len + j
        tslot = tl.load(page_row + tp // S, mask=j < tail_len, other=0) * S + tp % S
        tl.store(o + TOPK * KPOOL + j, tl.where(j < tail_len, tslot, -1).to(tl.int32),
                 mask=j < KPOOL - 1)


def pool_update(k: torch.Tensor, gate: torch.Tensor, tail: torch.Tensor, pool_keys: torch.Tensor,
                pool_scales: torch.Tensor | None, ape: torch.Tensor, slots: torch.Tensor,
                positions: torch.Tensor, page_table: torch.Tensor, page_size: int) -> None:
    """``ref.pool_update_ref`` in one launch (same arguments; rows of k / gate may be strided)."""
    n_seq = slots.shape[0]
    t_len, di = k.shape
    kpool = ape.shape[0]
    if n_seq == 0 or t_len % n_seq or page_size % kpool or tail.shape[1:] != (kpool, 2 * di):
        raise ValueError(f"pool_update: {t_len} tokens over {n_seq} sequences, tail "
                         f"{tuple(tail.shape)}, page size {page_size}, kpool {kpool}")
    if not k.is_cuda:
        interpret_casts.install()
    fp8 = pool_scales is not None
    _pool_update_kernel[(n_seq,)](
        k, gate, tail, pool_keys, pool_scales if fp8 else pool_keys, ape, slots, positions,
        page_table, t_len // n_seq, page_size, k.stride(0), gate.stride(0), tail.stride(0),
        page_table.stride(0), KPOOL=kpool, DI=di, FP8_KEYS=fp8, num_warps=1)


def index_select(q: torch.Tensor, w: torch.Tensor, pool_keys: torch.Tensor,
                 pool_scales: torch.Tensor | None, positions: torch.Tensor,
                 page_table: torch.Tensor, page_size: int, kpool: int, topk_pools: int,
                 select_tail: bool, softmax_scale: float, n: int) -> torch.Tensor:
    """Token slots [T, topk*kpool (+ kpool-1 tail)] int32, -1 padded (``ref.index_select_ref``).

    The score buffer is [T, max pools of a page-table row]: sized by the table's width, never by
    the lengths, so a CUDA graph captured for a table width serves every context up to it.
    """
    t_len, heads, di = q.shape
    max_pools = page_table.shape[1] * page_size // kpool
    width = topk_pools * kpool + (kpool - 1 if select_tail else 0)
    out = torch.empty(t_len, width, dtype=torch.int32, device=q.device)
    if t_len == 0:
        return out
    scores = torch.empty(t_len, max_pools, dtype=torch.float32, device=q.device)
    bp = 64
    if max_pools > topk_pools:
        _scores_kernel[(t_len, triton.cdiv(max_pools, bp))](
            q, w, pool_keys, pool_scales if pool_scales is not None else w, positions,
            page_table, scores, n, page_size, q.stride(0), q.stride(1), w.stride(0),
            page_table.stride(0), scores.stride(0), float(softmax_scale), HI=heads,
            HP=max(16, triton.next_power_of_2(heads)), DI=di,
            KPOOL=kpool, TOPK=topk_pools, BP=bp, FP8_KEYS=pool_scales is not None,
            DOT_FP32=q.dtype == torch.float32, num_warps=4)
    _select_kernel[(t_len,)](
        scores, positions, page_table, out, n, page_size, scores.stride(0),
        page_table.stride(0), out.stride(0), KPOOL=kpool, TOPK=topk_pools,
        TAIL=bool(select_tail and kpool > 1), BP=256, num_warps=4)
    return out
