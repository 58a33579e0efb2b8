"""Torch references for DSA: the k-pool indexer, top-k selection and absorbed sparse MLA.

Shapes (kernels/README.md): T query tokens, L context tokens, P pools, HI indexer heads,
DI indexer head dim, H attention heads, R latent rank (kv_lora_rank), W index-list width.

Indexer (MODEL.md section 2.5): pool p covers positions 4p..4p+3 (counted from position 0); its key
is a per-channel softmax-weighted mean of its tokens' keys. A query at position t scores every
complete pool whose last token is <= t, keeps the best ``topk_pools``, expands them to token
positions and appends the incomplete tail (t+1 mod kpool most recent positions). Index lists are
padded with -1. Attention then runs only over the listed positions.
"""

from __future__ import annotations

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
    """
    t_len, num_pools = scores.shape
    device = scores.device
    pool_end = torch.arange(num_pools, device=device) * kpool + (kpool - 1)
    valid = pool_end[None, :] <= query_pos[:, None]  # [T, P]
    k = min(topk_pools, num_pools)
    masked = scores.float().masked_fill(~valid, torch.finfo(torch.float32).min)
    picked = masked.topk(k, dim=-1).indices  # [T, k]
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
