"""The DSA indexer's score and top-k path in Triton, over FP8 pooled keys with one scale per pool.

Two kernels, the same maths as ``ref.indexer_scores_fp8_ref`` + ``ref.select_ref``:

1. ``pool_scores_fp8``: I(t, p) = sum_h w[t, h] * relu(q[t, h] . K_p * scale_p * softmax_scale),
   with -inf where pool p is not a candidate for query t (its last token 4p+3 is after t).
   One program per (query block, pool block); the heads loop reuses the pool tile. Keys are
   e4m3 and widened exactly to fp16 for the dot (fp32 accumulation); q is rounded to fp16.
2. ``select_topk_tokens``: per query row, the ``topk_pools`` best candidates by an exact radix
   threshold (32 bisection steps over the order-preserving integer image of the fp32 scores, so no
   sort), compacted in pool order, expanded to their ``kpool`` token positions, then the visible
   tail (the (t+1) mod kpool newest tokens). Ties at the threshold go to the lower pool id;
   ``torch.topk`` breaks them its own way (docs/model.md section 5), so compare selections as sets.

Output order differs from ``select_ref`` (pool order, not score order); attention does not care.
What this module does not know: where pooled keys live in the cache, or the attention that follows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_NEG_INF_KEY: tl.constexpr = tl.constexpr(-2139095041)  # _order_key(-inf)


@triton.jit
def _pool_scores_kernel(q_ptr, k_ptr, ks_ptr, w_ptr, pos_ptr, out_ptr, T, P,
                        stride_qt, stride_qh, stride_wt, stride_ot, softmax_scale,
                        HI: tl.constexpr, DI: tl.constexpr, KPOOL: tl.constexpr,
                        BT: tl.constexpr, BP: tl.constexpr):
    pid_t, pid_p = tl.program_id(0), tl.program_id(1)
    offs_t = pid_t * BT + tl.arange(0, BT)
    offs_p = pid_p * BP + tl.arange(0, BP)
    offs_d = tl.arange(0, DI)
    t_ok, p_ok = offs_t < T, offs_p < P
    keys = tl.load(k_ptr + offs_p[:, None] * DI + offs_d[None, :], mask=p_ok[:, None], other=0.0)
    keys = keys.to(tl.float16)  # e4m3 -> fp16 is exact
    key_scale = tl.load(ks_ptr + offs_p, mask=p_ok, other=0.0) * softmax_scale  # [BP]
    acc = tl.zeros([BT, BP], dtype=tl.float32)
    for h in range(HI):
        q = tl.load(q_ptr + offs_t[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                    mask=t_ok[:, None], other=0.0).to(tl.float16)  # [BT, DI]
        s = tl.dot(q, tl.trans(keys))  # [BT, BP] fp32
        w = tl.load(w_ptr + offs_t * stride_wt + h, mask=t_ok, other=0.0)  # [BT]
        acc += w[:, None] * tl.maximum(s * key_scale[None, :], 0.0)
    pos = tl.load(pos_ptr + offs_t, mask=t_ok, other=-1)
    candidate = (offs_p * KPOOL + (KPOOL - 1))[None, :] <= pos[:, None]
    acc = tl.where(candidate, acc, float("-inf"))
    tl.store(out_ptr + offs_t[:, None] * stride_ot + offs_p[None, :], acc,
             mask=t_ok[:, None] & p_ok[None, :])


@triton.jit
def _order_key(x):
    """fp32 -> int32 with the same order (flip the magnitude bits of negatives)."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _count_at_least(row_ptr, P, thr, BP: tl.constexpr):
    n = tl.zeros([], tl.int32)
    for start in range(0, P, BP):
        offs = start + tl.arange(0, BP)
        x = tl.load(row_ptr + offs, mask=offs < P, other=float("-inf"))
        n += tl.sum((_order_key(x) >= thr).to(tl.int32), axis=0)
    return n


@triton.jit
def _select_kernel(score_ptr, pos_ptr, out_ptr, P, stride_s, stride_o,
                   K: tl.constexpr, KPOOL: tl.constexpr, TAIL: tl.constexpr, BP: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = score_ptr + row * stride_s
    n_valid = _count_at_least(row_ptr, P, _NEG_INF_KEY + 1, BP)
    # The K-th largest score = the largest threshold with at least K keys at or above it.
    lo = tl.full([], -(2**31), tl.int64)
    hi = tl.full([], 2**31 - 1, tl.int64)
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        enough = _count_at_least(row_ptr, P, mid.to(tl.int32), BP) >= K
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
    take_all = n_valid <= K  # then every candidate is kept and -inf marks the rest
    thr = tl.where(take_all, _NEG_INF_KEY, lo.to(tl.int32))
    need_eq = tl.where(take_all, 0, K - _count_at_least(row_ptr, P, thr + 1, BP))
    taken = tl.zeros([], tl.int32)
    eq_seen = tl.zeros([], tl.int32)
    for start in range(0, P, BP):
        offs = start + tl.arange(0, BP)
        inside = offs < P
        key = _order_key(tl.load(row_ptr + offs, mask=inside, other=float("-inf")))
        eq = (key == thr) & inside
        eq_rank = eq_seen + tl.cumsum(eq.to(tl.int32), axis=0) - 1
        sel = ((key > thr) | (eq & (eq_rank < need_eq))) & inside
        slot = taken + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        for s in tl.static_range(KPOOL):
            tl.store(out_ptr + row * stride_o + slot * KPOOL + s, offs * KPOOL + s, mask=sel)
        taken += tl.sum(sel.to(tl.int32), axis=0)
        eq_seen += tl.sum(eq.to(tl.int32), axis=0)
    if TAIL:
        pos = tl.load(pos_ptr + row)
        tail_len = (pos + 1) % KPOOL
        for s in tl.static_range(KPOOL - 1):
            val = tl.where(s < tail_len, pos + 1 - tail_len + s, -1)
            tl.store(out_ptr + row * stride_o + K * KPOOL + s, val)


def pool_scores_fp8(q: torch.Tensor, keys_fp8: torch.Tensor, key_scale: torch.Tensor,
                    weights: torch.Tensor, query_pos: torch.Tensor, kpool: int,
                    softmax_scale: float) -> torch.Tensor:
    """Indexer scores over FP8 pooled keys.

    Args:
        q: [T, HI, DI] indexer queries (bf16/fp16/fp32).  keys_fp8: [P, DI] float8_e4m3fn.
        key_scale: [P] fp32 per-pool scale.  weights: [T, HI] fp32 (already x HI^-0.5).
        query_pos: [T] position of each query within its sequence (pool p covers kpool*p..).
    Returns:
        [T, P] fp32 scores, -inf for non-candidate pools.
    """
    t_len, heads, dim = q.shape
    num_pools = keys_fp8.shape[0]
    out = torch.empty(t_len, num_pools, dtype=torch.float32, device=q.device)
    if t_len == 0 or num_pools == 0:
        return out
    q, w = q.contiguous(), weights.float().contiguous()
    pos = query_pos.to(torch.int32).contiguous()
    block_t, block_p = (64 if t_len >= 64 else 16), 64  # 64-row dots lower to wgmma on SM90
    grid = (triton.cdiv(t_len, block_t), triton.cdiv(num_pools, block_p))
    keys, key_scale = keys_fp8.contiguous(), key_scale.float().contiguous()
    _pool_scores_kernel[grid](q, keys, key_scale, w, pos, out, t_len, num_pools, q.stride(0),
                              q.stride(1), w.stride(0), out.stride(0), softmax_scale, HI=heads,
                              DI=dim, KPOOL=kpool, BT=block_t, BP=block_p)
    return out


def select_topk_tokens(scores: torch.Tensor, query_pos: torch.Tensor, topk_pools: int, kpool: int,
                       select_tail: bool) -> torch.Tensor:
    """Top ``topk_pools`` candidate pools per row, expanded to token positions, plus the tail.

    Args:
        scores: [T, P] fp32, -inf for non-candidates.  query_pos: [T].
    Returns:
        [T, topk_pools*kpool + (kpool-1 if select_tail else 0)] int32 positions, -1 padded;
        selected pools in ascending pool order, then the tail in position order.
    """
    t_len, num_pools = scores.shape
    width = topk_pools * kpool + (kpool - 1 if select_tail and kpool > 1 else 0)
    out = torch.full((t_len, width), -1, dtype=torch.int32, device=scores.device)
    if t_len == 0:
        return out
    scores = scores.float().contiguous()
    pos = query_pos.to(torch.int32).contiguous()
    _select_kernel[(t_len,)](scores, pos, out, num_pools, scores.stride(0), out.stride(0),
                             K=topk_pools, KPOOL=kpool, TAIL=bool(select_tail and kpool > 1),
                             BP=256)
    return out


def indexer_select_fp8(q, keys_fp8, key_scale, weights, query_pos, topk_pools: int, kpool: int,
                       softmax_scale: float, select_tail: bool = True) -> torch.Tensor:
    """Scores then selection: the token positions each query attends to ([T, W] int32, -1 pad)."""
    scores = pool_scores_fp8(q, keys_fp8, key_scale, weights, query_pos, kpool, softmax_scale)
    return select_topk_tokens(scores, query_pos, topk_pools, kpool, select_tail)
