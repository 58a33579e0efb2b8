"""The DSA indexer's score and top-k path in Triton, over FP8 pooled keys with one scale per pool.

Kernels, the same maths as ``ref.indexer_scores_fp8_ref`` + ``ref.select_ref``:

1. ``pool_scores_fp8``: I(t, p) = sum_h w[t, h] * relu(q[t, h] . K_p * scale_p * softmax_scale),
   with -inf where pool p is not a candidate for query t (its last token 4p+3 is after t).
   One program per (query block, pool block); the heads loop reuses the pool tile. Keys are
   e4m3 and widened exactly to fp16 for the dot (fp32 accumulation); q is rounded to fp16.
2. ``select_topk_tokens``: per query row, the ``topk_pools`` best candidates by an exact radix
   threshold (32 bisection steps over the order-preserving integer image of the fp32 scores, so no
   sort), compacted in pool order, expanded to their ``kpool`` token positions, then the visible
   tail (the (t+1) mod kpool newest tokens). Ties at the threshold go to the lower pool id;
   ``torch.topk`` breaks them its own way (docs/model.md section 5), so compare selections as sets.

3. ``pool_scores_fp8_paged``: the batched form. FP8 queries (``quantize_index_queries``: e4m3 and
   one fp32 scale per row and head) times FP8 keys on the FP8 tensor cores, for rows of many
   requests at once. Pool keys live in pages of ``PAGE_POOLS`` consecutive slots; each request
   has a page table. A program takes a block of query rows and one page column: rows whose
   requests map that page to the same slots (a shared prefix) are scored with one key tile read,
   so a prefix shared by a whole block is read once per block, not once per request.
   ``select_topk_tokens`` keeps a row of up to 16384 pools in registers (one read of the scores;
   the bisection counts in registers), and falls back to the streaming kernel above that.

Output order differs from ``select_ref`` (pool order, not score order); attention does not care.
What this module does not know: where pooled keys live in the cache, or the attention that follows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmlab.kernels.dsa.ref import quantize_index_queries_ref

PAGE_POOLS = 64  # pools per page of the pool-key store (the paged kernel's tile)
REGISTER_ROW_MAX = 16384  # longest score row the one-pass top-k holds in registers

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


@triton.jit
def _paged_scores_kernel(q_ptr, qs_ptr, k_ptr, ks_ptr, w_ptr, pos_ptr, req_ptr, pt_ptr, out_ptr,
                         T, P, stride_pt, stride_ot, softmax_scale, HI: tl.constexpr,
                         DI: tl.constexpr, KPOOL: tl.constexpr, BT: tl.constexpr,
                         PAGE: tl.constexpr):
    pid_t, pid_p = tl.program_id(0), tl.program_id(1)
    offs_t = pid_t * BT + tl.arange(0, BT)
    offs_j = tl.arange(0, PAGE)
    offs_d = tl.arange(0, DI)
    pools = pid_p * PAGE + offs_j
    t_ok, p_ok = offs_t < T, pools < P
    req = tl.load(req_ptr + offs_t, mask=t_ok, other=0)
    base = tl.load(pt_ptr + req * stride_pt + pid_p, mask=t_ok, other=-1)  # [BT] first slot
    todo = t_ok & (base >= 0)
    acc = tl.zeros([BT, PAGE], dtype=tl.float32)
    # One key tile per distinct page among the block's rows (one for a shared prefix).
    while tl.sum(todo.to(tl.int32), axis=0) > 0:
        b = tl.min(tl.where(todo, base, 2147483647), axis=0)
        rows = todo & (base == b)
        keys = tl.load(k_ptr + (b + offs_j)[:, None] * DI + offs_d[None, :], mask=p_ok[:, None],
                       other=0.0)  # [PAGE, DI] e4m3
        key_scale = tl.load(ks_ptr + b + offs_j, mask=p_ok, other=0.0) * softmax_scale
        part = tl.zeros([BT, PAGE], dtype=tl.float32)
        for h in range(HI):
            qh = tl.load(q_ptr + (offs_t[:, None] * HI + h) * DI + offs_d[None, :],
                         mask=rows[:, None], other=0.0)  # [BT, DI] e4m3
            s = tl.dot(qh, tl.trans(keys))  # FP8 MMA, fp32 accumulation
            q_scale = tl.load(qs_ptr + offs_t * HI + h, mask=rows, other=0.0)
            w = tl.load(w_ptr + offs_t * HI + h, mask=rows, other=0.0)
            part += w[:, None] * tl.maximum(s * q_scale[:, None] * key_scale[None, :], 0.0)
        acc = tl.where(rows[:, None], part, acc)
        todo = todo & (base != b)
    pos = tl.load(pos_ptr + offs_t, mask=t_ok, other=-1)
    candidate = ((pools * KPOOL + (KPOOL - 1))[None, :] <= pos[:, None]) & (base >= 0)[:, None]
    acc = tl.where(candidate, acc, float("-inf"))
    tl.store(out_ptr + offs_t[:, None] * stride_ot + pools[None, :], acc,
             mask=t_ok[:, None] & p_ok[None, :])


@triton.jit
def _block_rows(req_ptr, T, pid_t, G: tl.constexpr):
    rows = pid_t * G + tl.arange(0, G)  # [G]
    t_ok = rows < T
    req = tl.load(req_ptr + rows, mask=t_ok, other=0)
    first = tl.min(tl.where(t_ok, req, 2147483647), axis=0)
    uniform = tl.max(tl.where(t_ok, req, first), axis=0) == first
    return rows, t_ok, req, first, uniform


@triton.jit
def _block_queries(q_ptr, qs_ptr, w_ptr, T, pid_t, softmax_scale, HI: tl.constexpr,
                   DI: tl.constexpr, G: tl.constexpr):
    # The MMA's M axis is (row, head): the block's G * HI query heads [G*HI, DI] (rows are
    # contiguous in [T, HI, DI]), and relu(s * qs * ks * scale) * w == (w * qs * scale) *
    # relu(s) * ks, as every scale is >= 0.
    M: tl.constexpr = G * HI
    offs_m = tl.arange(0, M)
    m_ok = pid_t * G + offs_m // HI < T
    offs_d = tl.arange(0, DI)
    q = tl.load(q_ptr + (pid_t * M + offs_m)[:, None] * DI + offs_d[None, :],
                mask=m_ok[:, None], other=0.0)  # [M, DI] e4m3
    qw = tl.load(w_ptr + pid_t * M + offs_m, mask=m_ok, other=0.0) * tl.load(
        qs_ptr + pid_t * M + offs_m, mask=m_ok, other=0.0) * softmax_scale  # [M]
    return q, qw


@triton.jit
def _page_scores(q, qw, keys_t, ks, G: tl.constexpr, HI: tl.constexpr, PAGE: tl.constexpr):
    s = tl.dot(q, keys_t)  # [G*HI, PAGE]: FP8 MMA, fp32 accumulation
    s = tl.maximum(s, 0.0) * qw[:, None]
    return tl.sum(tl.reshape(s, (G, HI, PAGE)), axis=1) * ks[None, :]  # [G, PAGE]


@triton.jit
def _paged_scores_uniform_kernel(q_ptr, qs_ptr, k_ptr, ks_ptr, w_ptr, pos_ptr, req_ptr, pt_ptr,
                                 out_ptr, T, P, NP, stride_pt, stride_ot, softmax_scale,
                                 HI: tl.constexpr, DI: tl.constexpr, KPOOL: tl.constexpr,
                                 G: tl.constexpr, PAGE: tl.constexpr, PAGES: tl.constexpr):
    # Blocks of G rows of ONE request (the rows of a verify request): one key page per column,
    # a static loop over PAGES columns that Triton software-pipelines (keys prefetched).
    pid_t, pid_p = tl.program_id(0), tl.program_id(1)
    rows, t_ok, req, first, uniform = _block_rows(req_ptr, T, pid_t, G)
    if not uniform:
        return
    q, qw = _block_queries(q_ptr, qs_ptr, w_ptr, T, pid_t, softmax_scale, HI, DI, G)
    pos = tl.load(pos_ptr + rows, mask=t_ok, other=-1)
    offs_j = tl.arange(0, PAGE)
    offs_d = tl.arange(0, DI)
    offs_c = tl.arange(0, PAGES)
    cols = pid_p * PAGES + offs_c
    bases = tl.load(pt_ptr + first * stride_pt + cols, mask=cols < NP, other=-1)  # [PAGES]
    # NOTE: keys of the next page are loaded (into registers: 32 B per thread) before this
    # page's dot, by hand: Triton 3.7's pipeliner does not stage this key load.
    base = tl.max(tl.where(offs_c == 0, bases, -1), axis=0)
    keys_t, ks = _page_keys(k_ptr, ks_ptr, base, offs_j, offs_d, DI)
    for c in range(PAGES):
        base_n = tl.max(tl.where(offs_c == c + 1, bases, -1), axis=0)
        keys_n, ks_n = _page_keys(k_ptr, ks_ptr, base_n, offs_j, offs_d, DI)
        acc = _page_scores(q, qw, keys_t, ks, G, HI, PAGE)
        pools = (pid_p * PAGES + c) * PAGE + offs_j
        candidate = ((pools * KPOOL + (KPOOL - 1))[None, :] <= pos[:, None]) & (base >= 0)
        tl.store(out_ptr + rows[:, None] * stride_ot + pools[None, :],
                 tl.where(candidate, acc, float("-inf")),
                 mask=t_ok[:, None] & (pools < P)[None, :])
        base, keys_t, ks = base_n, keys_n, ks_n


@triton.jit
def _page_keys(k_ptr, ks_ptr, base, offs_j, offs_d, DI: tl.constexpr):
    """A page's keys as [DI, PAGE] e4m3 (the dot's K-major B) and its [PAGE] scales; zeros for
    a missing page (base < 0)."""
    ok = base >= 0
    slots = tl.maximum(base, 0) + offs_j
    keys_t = tl.load(k_ptr + slots[None, :] * DI + offs_d[:, None], mask=ok, other=0.0)
    return keys_t, tl.load(ks_ptr + slots, mask=ok, other=0.0)


@triton.jit
def _paged_scores_mixed_kernel(q_ptr, qs_ptr, k_ptr, ks_ptr, w_ptr, pos_ptr, req_ptr, pt_ptr,
                               out_ptr, T, P, NP, stride_pt, stride_ot, softmax_scale,
                               HI: tl.constexpr, DI: tl.constexpr, KPOOL: tl.constexpr,
                               G: tl.constexpr, PAGE: tl.constexpr, PAGES: tl.constexpr):
    # Blocks whose G rows span requests: one key tile per distinct page among the rows (a
    # prefix shared by the rows is read once), the other rows' results discarded.
    pid_t, pid_p = tl.program_id(0), tl.program_id(1)
    rows, t_ok, req, first, uniform = _block_rows(req_ptr, T, pid_t, G)
    if not uniform:
        q, qw = _block_queries(q_ptr, qs_ptr, w_ptr, T, pid_t, softmax_scale, HI, DI, G)
        pos = tl.load(pos_ptr + rows, mask=t_ok, other=-1)
        offs_j = tl.arange(0, PAGE)
        offs_d = tl.arange(0, DI)
        for c in range(PAGES):
            col = pid_p * PAGES + c
            base = tl.load(pt_ptr + req * stride_pt + col, mask=t_ok & (col < NP), other=-1)
            todo = t_ok & (base >= 0)
            acc = tl.zeros([G, PAGE], dtype=tl.float32)
            while tl.sum(todo.to(tl.int32), axis=0) > 0:
                b = tl.min(tl.where(todo, base, 2147483647), axis=0)
                on_b = todo & (base == b)
                keys_t = tl.load(k_ptr + (b + offs_j)[None, :] * DI + offs_d[:, None])
                part = _page_scores(q, qw, keys_t, tl.load(ks_ptr + b + offs_j), G, HI, PAGE)
                acc = tl.where(on_b[:, None], part, acc)
                todo = todo & (base != b)
            pools = col * PAGE + offs_j
            candidate = (((pools * KPOOL + (KPOOL - 1))[None, :] <= pos[:, None])
                         & (base >= 0)[:, None])
            tl.store(out_ptr + rows[:, None] * stride_ot + pools[None, :],
                     tl.where(candidate, acc, float("-inf")),
                     mask=t_ok[:, None] & (pools < P)[None, :])


@triton.jit
def _select_in_registers_kernel(score_ptr, pos_ptr, out_ptr, P, stride_s, stride_o,
                                K: tl.constexpr, KPOOL: tl.constexpr, TAIL: tl.constexpr,
                                BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    inside = offs < P
    key = _order_key(tl.load(score_ptr + row * stride_s + offs, mask=inside,
                             other=float("-inf")))
    n_valid = tl.sum((key > _NEG_INF_KEY).to(tl.int32), axis=0)
    lo = tl.full([], -(2**31), tl.int64)
    hi = tl.full([], 2**31 - 1, tl.int64)
    for _ in range(32):  # the K-th largest key: every count runs on the row held in registers
        mid = lo + (hi - lo + 1) // 2
        enough = tl.sum((key >= mid.to(tl.int32)).to(tl.int32), axis=0) >= K
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
    take_all = n_valid <= K
    thr = tl.where(take_all, _NEG_INF_KEY, lo.to(tl.int32))
    need_eq = tl.where(take_all, 0, K - tl.sum((key > thr).to(tl.int32), axis=0))
    eq = (key == thr) & inside
    eq_rank = tl.cumsum(eq.to(tl.int32), axis=0) - 1
    sel = ((key > thr) | (eq & (eq_rank < need_eq))) & inside
    slot = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    for s in tl.static_range(KPOOL):
        tl.store(out_ptr + row * stride_o + slot * KPOOL + s, offs * KPOOL + s, mask=sel)
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
    tail = bool(select_tail and kpool > 1)
    if num_pools <= REGISTER_ROW_MAX:
        block = triton.next_power_of_2(max(num_pools, 16))
        _select_in_registers_kernel[(t_len,)](scores, pos, out, num_pools, scores.stride(0),
                                              out.stride(0), K=topk_pools, KPOOL=kpool,
                                              TAIL=tail, BLOCK=block,
                                              num_warps=16 if block >= 4096 else 4)
        return out
    _select_kernel[(t_len,)](scores, pos, out, num_pools, scores.stride(0), out.stride(0),
                             K=topk_pools, KPOOL=kpool, TAIL=tail, BP=256)
    return out


def indexer_select_fp8(q, keys_fp8, key_scale, weights, query_pos, topk_pools: int, kpool: int,
                       softmax_scale: float, select_tail: bool = True) -> torch.Tensor:
    """Scores then selection: the token positions each query attends to ([T, W] int32, -1 pad)."""
    scores = pool_scores_fp8(q, keys_fp8, key_scale, weights, query_pos, kpool, softmax_scale)
    return select_topk_tokens(scores, query_pos, topk_pools, kpool, select_tail)


def quantize_index_queries(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, HI, DI] -> (e4m3 [T, HI, DI], fp32 scale [T, HI]): ``ref.quantize_index_queries_ref``
    (in torch: one pass, and exact where Triton's interpreter rounds e4m3 casts approximately)."""
    return quantize_index_queries_ref(q)


def dequantize_index_queries(q_fp8: torch.Tensor, q_scale: torch.Tensor) -> torch.Tensor:
    return q_fp8.float() * q_scale.float()[..., None]


def paged_rows_per_program(heads: int) -> int:
    """Query rows per program of the (row, head)-M kernels: M = rows * heads = 256 (a verify
    request's 8 rows at 32 index heads fill it and share each page)."""
    return max(1, 256 // heads)


def paged_pages_per_program(row_blocks: int, num_pages: int, num_sms: int = 132) -> int:
    """Page columns per program: as many as keep >= 4 programs per SM (each program loads its
    queries once and pipelines its key pages), at most 32, a power of two."""
    pages = 32
    while pages > 1 and row_blocks * -(-num_pages // pages) < 4 * num_sms:
        pages //= 2
    return max(1, min(pages, num_pages))


def pool_scores_fp8_paged(q_fp8: torch.Tensor, q_scale: torch.Tensor, keys_fp8: torch.Tensor,
                          key_scale: torch.Tensor, weights: torch.Tensor, query_pos: torch.Tensor,
                          page_table: torch.Tensor, row_request: torch.Tensor, kpool: int,
                          softmax_scale: float, rows_per_program: int | None = None
                          ) -> torch.Tensor:
    """Indexer scores of a batch of requests over paged FP8 pooled keys, FP8 queries.

    Args:
        q_fp8, q_scale: [T, HI, DI] e4m3 and [T, HI] fp32 (``quantize_index_queries``).
        keys_fp8, key_scale: [S, DI] e4m3 and [S] fp32: the pool-key store (S slots).
        weights: [T, HI] fp32 (already x HI^-0.5).  query_pos: [T] position in its sequence.
        page_table: [B, NP] int32: slot of pool ``PAGE_POOLS * j`` of request b (its page j
            holds pools ``PAGE_POOLS*j ..`` in consecutive slots); -1 = no such page.
        row_request: [T] int32 request of each query row (rows of one request adjacent: the
            rows of a block then share their pages).
        rows_per_program: rows per block (a power of two; default ``paged_rows_per_program``:
            8 at 32 heads). A hint from the caller, who knows its batch: the rows per request
            (8 for a verify block, 1 for plain decode, where an 8-row block would span 8
            requests). Any value gives the same scores.
    Returns:
        [T, NP * PAGE_POOLS] fp32 scores over each row's pools, -inf for non-candidates
        (pool end after the query, or a missing page).

    Rows go in blocks of ``rows_per_program`` rows (8 at 32 heads); the FP8 MMA's M axis
    is (row, head), so a 64-pool key page meets all 256 query heads of a block in one dot and is
    read once per block. Two kernels share the blocks (each skips the other's): blocks of one
    request (a verify request's rows) run a software-pipelined loop over their pages; blocks
    that span requests read one key tile per distinct page among their rows (a shared prefix
    once) and discard the other rows' results. HI must be a power of two (else the round-2
    kernel, ``pool_scores_fp8_paged_rowblock``, runs).
    """
    t_len, heads, dim = q_fp8.shape
    if heads & (heads - 1):
        return pool_scores_fp8_paged_rowblock(q_fp8, q_scale, keys_fp8, key_scale, weights,
                                              query_pos, page_table, row_request, kpool,
                                              softmax_scale)
    num_pages = page_table.shape[1]
    num_pools = num_pages * PAGE_POOLS
    out = torch.empty(t_len, num_pools, dtype=torch.float32, device=q_fp8.device)
    if t_len == 0 or num_pools == 0:
        return out
    if q_fp8.dtype != torch.float8_e4m3fn or keys_fp8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"FP8 queries and keys expected, got {q_fp8.dtype} / {keys_fp8.dtype}")
    rows = rows_per_program or paged_rows_per_program(heads)
    if rows & (rows - 1) or rows * heads < 16:
        raise ValueError(f"rows_per_program {rows}: a power of two with rows x heads >= 16")
    blocks = triton.cdiv(t_len, rows)
    pages = paged_pages_per_program(blocks, num_pages)
    grid = (blocks, triton.cdiv(num_pages, pages))
    pt = page_table.to(torch.int32).contiguous()
    args = (q_fp8.contiguous(), q_scale.float().contiguous(), keys_fp8.contiguous(),
            key_scale.float().contiguous(), weights.float().contiguous(),
            query_pos.to(torch.int32).contiguous(), row_request.to(torch.int32).contiguous(), pt,
            out, t_len, num_pools, num_pages, pt.stride(0), out.stride(0), softmax_scale)
    meta = dict(HI=heads, DI=dim, KPOOL=kpool, G=rows, PAGE=PAGE_POOLS, PAGES=pages,
                num_warps=8 if rows * heads >= 256 else 4)
    _paged_scores_uniform_kernel[grid](*args, **meta)
    _paged_scores_mixed_kernel[grid](*args, **meta)
    return out


def pool_scores_fp8_paged_rowblock(q_fp8: torch.Tensor, q_scale: torch.Tensor,
                                   keys_fp8: torch.Tensor, key_scale: torch.Tensor,
                                   weights: torch.Tensor, query_pos: torch.Tensor,
                                   page_table: torch.Tensor, row_request: torch.Tensor,
                                   kpool: int, softmax_scale: float) -> torch.Tensor:
    """``pool_scores_fp8_paged`` by the round-2 kernel (benchmarks' previous version): a 64-row
    block per program, one dot per head with the block's rows as M, so rows of different pages
    in one block each cost a whole masked dot.

    Args:
        q_fp8, q_scale: [T, HI, DI] e4m3 and [T, HI] fp32 (``quantize_index_queries``).
        keys_fp8, key_scale: [S, DI] e4m3 and [S] fp32: the pool-key store (S slots).
        weights: [T, HI] fp32 (already x HI^-0.5).  query_pos: [T] position in its sequence.
        page_table: [B, NP] int32: slot of pool ``PAGE_POOLS * j`` of request b (its page j
            holds pools ``PAGE_POOLS*j ..`` in consecutive slots); -1 = no such page.
        row_request: [T] int32 request of each query row (rows of one request adjacent: blocks
            of rows then share pages).
    Returns:
        [T, NP * PAGE_POOLS] fp32 scores over each row's pools, -inf for non-candidates
        (pool end after the query, or a missing page).
    """
    t_len, heads, dim = q_fp8.shape
    num_pools = page_table.shape[1] * PAGE_POOLS
    out = torch.empty(t_len, num_pools, dtype=torch.float32, device=q_fp8.device)
    if t_len == 0 or num_pools == 0:
        return out
    if q_fp8.dtype != torch.float8_e4m3fn or keys_fp8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"FP8 queries and keys expected, got {q_fp8.dtype} / {keys_fp8.dtype}")
    block_t = 64 if t_len >= 64 else 16
    grid = (triton.cdiv(t_len, block_t), page_table.shape[1])
    pt = page_table.to(torch.int32).contiguous()
    _paged_scores_kernel[grid](q_fp8.contiguous(), q_scale.float().contiguous(),
                               keys_fp8.contiguous(), key_scale.float().contiguous(),
                               weights.float().contiguous(), query_pos.to(torch.int32).contiguous(),
                               row_request.to(torch.int32).contiguous(), pt, out, t_len,
                               num_pools, pt.stride(0), out.stride(0), softmax_scale, HI=heads,
                               DI=dim, KPOOL=kpool, BT=block_t, PAGE=PAGE_POOLS)
    return out
