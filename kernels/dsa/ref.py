"""Torch references for DSA: the k-pool indexer, top-k selection and absorbed sparse MLA.

Shapes (kernels/README.md): T query tokens, L context tokens, P pools, HI indexer heads,
DI indexer head dim, H attention heads, R latent rank (kv_lora_rank), W index-list width.

Indexer (docs/model.md section 2.5): pool p covers positions 4p..4p+3 (counted from position 0);
its key is a per-channel softmax-weighted mean of its tokens' keys. A query at position t scores
every complete pool whose last token is <= t, keeps the best ``topk_pools``, expands them to token
positions and appends the incomplete tail (t+1 mod kpool most recent positions). Index lists are
padded with -1. Attention then runs only over the listed positions.
"""

from __future__ import annotations

import math

import torch


def pool_keys_ref(keys: torch.Tensor, gate: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """Compress complete pools.

    Args:
        keys, gate: [P*kpool, DI] per-token indexer keys and gate logits (pool-major order).
        ape: [kpool, DI] learned per-slot bias.
    Returns:
        [P, DI] pooled keys in keys.dtype (softmax in fp32, rounded to keys.dtype first, as HF).
    """
    kpool, d = ape.shape
    logits = gate.float().view(-1, kpool, d) + ape.float()
    probs = logits.softmax(dim=1).to(keys.dtype)
    return (probs * keys.view(-1, kpool, d)).sum(dim=1)


def indexer_scores_ref(q: torch.Tensor, pool_keys: torch.Tensor, weights: torch.Tensor,
                       softmax_scale: float) -> torch.Tensor:
    """I(t, p) = sum_h w_t[h] * relu(q_t[h] . K_p * scale), in fp32.

    Args:
        q: [T, HI, DI].  pool_keys: [P, DI].  weights: [T, HI] (already scaled by HI^-0.5).
    Returns:
        [T, P] fp32.
    """
    s = torch.relu(torch.einsum("thd,pd->thp", q.float(), pool_keys.float()) * softmax_scale)
    return torch.einsum("th,thp->tp", weights.float(), s)


def select_ref(scores: torch.Tensor, query_pos: torch.Tensor, topk_pools: int, kpool: int,
               select_tail: bool) -> torch.Tensor:
    """Top-k pools per query, expanded to token positions, plus the visible tail.

    Args:
        scores: [T, P] over pools 0..P-1 of this sequence (all complete).
        query_pos: [T] absolute position of each query.
    Returns:
        [T, topk_pools*kpool + (kpool-1 if select_tail else 0)] int64 positions, -1 padded.
        Selected pools come first in descending score order, then the tail in position order.
        Equal scores are broken towards the lower pool id. Ties are common (a pool whose heads
        all ReLU to 0 scores exactly 0), and ``torch.topk`` breaks them differently for rows of
        different widths; a fixed rule makes the choice independent of how many queries or pools
        a step holds, so prefill, chunked prefill, decode and speculative verify agree.
    """
    t_len, num_pools = scores.shape
    device = scores.device
    pool_end = torch.arange(num_pools, device=device) * kpool + (kpool - 1)
    valid = pool_end[None, :] <= query_pos[:, None]  # [T, P]
    k = min(topk_pools, num_pools)
    masked = scores.float().masked_fill(~valid, torch.finfo(torch.float32).min)
    picked = masked.sort(dim=-1, descending=True, stable=True).indices[:, :k]  # [T, k]
    picked_ok = valid.gather(-1, picked)
    offs = torch.arange(kpool, device=device)
    tokens = (picked[..., None] * kpool + offs).masked_fill(~picked_ok[..., None], -1)
    tokens = tokens.flatten(1)
    width = topk_pools * kpool
    parts = [tokens, tokens.new_full((t_len, width - tokens.shape[1]), -1)]
    if select_tail and kpool > 1:
        tail_len = (query_pos + 1) % kpool
        tail_start = query_pos + 1 - tail_len
        tail = tail_start[:, None] + offs[None, : kpool - 1]
        parts.append(tail.masked_fill(offs[None, : kpool - 1] >= tail_len[:, None], -1))
    return torch.cat(parts, dim=1)


def sparse_mla_ref(q: torch.Tensor, kv_rows: torch.Tensor, valid: torch.Tensor,
                   softmax_scale: float) -> torch.Tensor:
    """Absorbed sparse MLA: one shared R-dim key = value per selected position.

    Args:
        q: [T, H, R] queries already multiplied by W_UK (q~ = W_UK^T q).
        kv_rows: [T, W, R] the latent rows each query selected (gathered by index).
        valid: [T, W] bool, False where the index list was padded (-1).
    Returns:
        [T, H, R] fp32 latent outputs (multiply by W_UV afterwards); rows with nothing valid are 0.
    """
    kv = kv_rows.float()
    logits = torch.einsum("thr,twr->thw", q.float(), kv) * softmax_scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.nan_to_num(logits.softmax(dim=-1))  # all -inf rows -> zeros
    return torch.einsum("thw,twr->thr", p, kv)


# ---------------------------------------------------------------------------------------------
# FP8 pooled keys (sglang stores one e4m3 key + one fp32 scale per pool; docs/model.md section 2.5)
POOL_KEY_FP8_MAX = 448.0


def quantize_pool_keys_ref(pool_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[P, DI] pooled keys -> (e4m3 [P, DI], fp32 scale [P]) with scale = absmax / 448 per pool.

    An all-zero key stores scale 0 (its dequantised key is exactly zero).
    """
    k = pool_keys.float()
    scale = k.abs().amax(dim=-1) / POOL_KEY_FP8_MAX  # [P]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (k / safe[:, None]).clamp(-POOL_KEY_FP8_MAX, POOL_KEY_FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def indexer_scores_fp8_ref(q: torch.Tensor, keys_fp8: torch.Tensor, key_scale: torch.Tensor,
                           weights: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """``indexer_scores_ref`` over FP8 pooled keys: K_p = keys_fp8[p] * key_scale[p] (fp32)."""
    keys = keys_fp8.float() * key_scale.float()[:, None]
    return indexer_scores_ref(q, keys, weights, softmax_scale)


def quantize_index_queries_ref(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, HI, DI] indexer queries -> (e4m3 [T, HI, DI], fp32 scale [T, HI]), scale = absmax/448.

    The FP8 score kernel multiplies e4m3 queries by e4m3 keys; the scores then carry this rounding
    of q (a zero query head stores scale 0)."""
    x = q.float()
    scale = x.abs().amax(dim=-1) / POOL_KEY_FP8_MAX  # [T, HI]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q8 = (x / safe[..., None]).clamp(-POOL_KEY_FP8_MAX, POOL_KEY_FP8_MAX).to(torch.float8_e4m3fn)
    return q8, scale


def candidate_mask(query_pos: torch.Tensor, num_pools: int, kpool: int) -> torch.Tensor:
    """[T, P] bool: pool p is a candidate for a query at position t iff its last token 4p+3 <= t."""
    pool_end = torch.arange(num_pools, device=query_pos.device) * kpool + (kpool - 1)
    return pool_end[None, :] <= query_pos[:, None]


# ---------------------------------------------------------------------------------------------
# Sparse MLA split into the kernels' two stages (Partial over contiguous KV tile ranges, Combine)
EMPTY_LSE = -(2.0**30)  # base-2 LSE of a split with no valid index (Combine then ignores it)
LOG2E = 1.4426950408889634


def split_bounds(width: int, block_i: int, num_splits: int) -> list[tuple[int, int]]:
    """Index-list columns [start, end) each split covers, as the Partial kernel walks them.

    The list is cut into ceil(width / block_i) tiles (the last one virtually padded: columns past
    ``width`` are masked, never read), and each split takes ceil(tiles / num_splits) whole tiles.
    Later splits may be empty.
    """
    tiles = -(-width // block_i)
    per = -(-tiles // num_splits)
    out = []
    for s in range(num_splits):
        first, last = s * per, min(s * per + per, tiles)
        out.append((min(first * block_i, width), min(max(last, first) * block_i, width)))
    return out


def sparse_mla_partial_ref(q: torch.Tensor, kv_rows: torch.Tensor, valid: torch.Tensor,
                           softmax_scale: float, block_i: int, num_splits: int
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """What the Partial kernel computes, split by split (fp32, whole splits at once).

    Args:
        q: [T, H, R].  kv_rows: [T, W, R] gathered latent rows.  valid: [T, W] bool.
    Returns:
        partial_o [T, S, H, R]: softmax-weighted rows of each split, normalised within the split
        (zeros for a split with nothing valid); partial_lse [T, S, H]: base-2 log-sum-exp of the
        split's scaled scores (``EMPTY_LSE`` when nothing is valid).
    """
    kv = kv_rows.float()
    logits = torch.einsum("thr,twr->thw", q.float(), kv) * (softmax_scale * LOG2E)  # base 2
    outs, lses = [], []
    for start, end in split_bounds(kv.shape[1], block_i, num_splits):
        s = logits[..., start:end].masked_fill(~valid[:, None, start:end], float("-inf"))
        lse = torch.logsumexp(s * math.log(2.0), dim=-1) * LOG2E  # [T, H]
        empty = ~valid[:, start:end].any(dim=-1)[:, None].expand_as(lse)
        p = torch.nan_to_num(torch.exp2(s - lse[..., None]))
        outs.append(torch.einsum("thw,twr->thr", p, kv[:, start:end]))
        lses.append(lse.masked_fill(empty, EMPTY_LSE))
    return torch.stack(outs, dim=1), torch.stack(lses, dim=1)


def sparse_mla_combine_ref(partial_o: torch.Tensor, partial_lse: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge splits by LSE: w_s = 2^(LSE_s - LSE), LSE = log2 sum_s 2^LSE_s; O = sum_s w_s O_s.

    Args: partial_o [T, S, H, R], partial_lse [T, S, H] (base 2).
    Returns: out [T, H, R] fp32, lse [T, H] (base 2; about ``EMPTY_LSE`` for an all-empty row).
    """
    lse_max = partial_lse.amax(dim=1, keepdim=True)  # [T, 1, H]
    w = torch.exp2(partial_lse - lse_max)
    total = w.sum(dim=1, keepdim=True)
    out = ((w / total)[..., None] * partial_o.float()).sum(dim=1)
    return out, (lse_max + torch.log2(total))[:, 0]
