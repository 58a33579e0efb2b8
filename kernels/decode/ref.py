"""Torch references of the decode-step kernels: the in-place KDA window and the paged DSA indexer.

Both serve *uniform* steps (N sequences x n new tokens each: decode n = 1, verify n = D), read
carried state through state slots and token rows through a page table, and have fixed output
shapes, so a step built on them has no host synchronisation and can be captured in a CUDA graph.
Shapes (kernels/README.md): T = N*n tokens, H heads, K = V head dim, S state slots, P pools,
DI indexer head dim, W index-list width.

KDA window (docs/model.md section 2.4): per sequence and head, the delta rule over the n steps
from the state at ``recurrent[slot]`` (``kda.ref.kda_recurrent_ref``); the final state is written
back (decode) or left alone (verify: the commit decides), and the outputs go through the gated
head norm o = RMSNorm_{o_norm}(o_h) * sigmoid(gate_h), as the KDA layer does.

Paged indexer (docs/model.md section 2.5): token t of sequence i is at position
``positions[t]``; its token slot is ``page_table[i, pos // S] * S + pos % S`` and pool p's key
lives at pool slot ``slot(kpool * p) // kpool``.
"""

from __future__ import annotations

import torch

from glmlab.kernels.dsa.ref import indexer_scores_ref, pool_keys_ref, quantize_pool_keys_ref
from glmlab.kernels.kda.ref import kda_recurrent_ref


def gated_head_norm_ref(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> torch.Tensor:
    """o [T, H, V] (rounded to gate.dtype first), gate [T, H, V] -> [T, H, V] in gate.dtype."""
    of = o.to(gate.dtype).float()
    of = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * of * torch.sigmoid(gate.float())).to(gate.dtype)


def kda_window_ref(q, k, v, g, beta, recurrent: torch.Tensor, slots: torch.Tensor,
                   gate: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                   store_state: bool) -> torch.Tensor:
    """q, k, g [T, H, K] fp32; v [T, H, V]; beta [T, H]; gate [T, H*V] -> out [T, H*V].

    ``recurrent`` [S, H, K, V] is read at ``slots`` [N] and, with ``store_state``, overwritten
    there with the state after the n steps.
    """
    n_seq = slots.shape[0]
    n = k.shape[0] // n_seq
    o, final = kda_recurrent_ref(*(t.view(n_seq, n, *t.shape[1:]) for t in (q, k, v, g, beta)),
                                 recurrent[slots].float())
    if store_state:
        recurrent[slots] = final.to(recurrent.dtype)
    o = o.flatten(0, 1)
    return gated_head_norm_ref(o, gate.view(o.shape), norm_weight, eps).flatten(1)


def token_slots(page_table: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor,
                page_size: int) -> torch.Tensor:
    """Token slot of position ``pos`` of sequence ``seq`` (broadcasting); -1 where pos < 0."""
    page = page_table[seq, (pos.clamp(min=0) // page_size)]
    return torch.where(pos >= 0, page.long() * page_size + pos.clamp(min=0) % page_size, -1)


def pool_update_ref(k: torch.Tensor, gate: torch.Tensor, tail: torch.Tensor,
                    pool_keys: torch.Tensor, pool_scales: torch.Tensor | None,
                    ape: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                    page_table: torch.Tensor, page_size: int) -> None:
    """Append each new token's (key, gate) row; compress every pool the step completes.

    k, gate: [T, DI] indexer keys and gate logits; tail: [S, kpool, 2*DI] the incomplete pool's
    rows per state slot; pool_keys [num_pools, DI] (e4m3 with ``pool_scales`` [num_pools] fp32,
    or plain). Per sequence as ``dsa.DSAttention.update_pools`` does it.
    """
    kpool, d = ape.shape
    n_seq = slots.shape[0]
    n = k.shape[0] // n_seq
    rows = torch.cat([k, gate], dim=-1).view(n_seq, n, -1)
    for i in range(n_seq):
        start = int(positions[i * n])
        held = start % kpool
        seq_rows = torch.cat([tail[slots[i], :held].to(k.dtype), rows[i]])
        done = (held + n) // kpool
        if done:
            keys = pool_keys_ref(seq_rows[: done * kpool, :d], seq_rows[: done * kpool, d:], ape)
            first = torch.arange(done, device=k.device) * kpool + (start - held)
            pool_slot = token_slots(page_table, torch.full_like(first, i), first,
                                    page_size) // kpool
            if pool_scales is not None:
                keys, scale = quantize_pool_keys_ref(keys)
                pool_scales[pool_slot] = scale
            pool_keys[pool_slot] = keys.to(pool_keys.dtype)
        rest = seq_rows[done * kpool:]
        tail[slots[i], : rest.shape[0]] = rest.to(tail.dtype)


def index_select_ref(q: torch.Tensor, w: torch.Tensor, pool_keys: torch.Tensor,
                     pool_scales: torch.Tensor | None, positions: torch.Tensor,
                     page_table: torch.Tensor, page_size: int, kpool: int, topk_pools: int,
                     select_tail: bool, softmax_scale: float, n: int) -> torch.Tensor:
    """[T, W] token slots each query attends to (-1 padded), as sets equal to the layer's.

    q: [T, HI, DI]; w: [T, HI] head weights (already x HI^-0.5). A query at position t keeps the
    ``topk_pools`` best complete pools (last token <= t; all of them when there are no more than
    that) and the (t+1) mod kpool newest positions. Ties go to the lower pool id.
    """
    t_len = q.shape[0]
    width = topk_pools * kpool + (kpool - 1 if select_tail else 0)
    out = torch.full((t_len, width), -1, dtype=torch.long, device=q.device)
    for t in range(t_len):
        pos, seq = int(positions[t]), t // n
        num_pools = (pos + 1) // kpool
        pools = torch.arange(num_pools, device=q.device)
        if num_pools > topk_pools:
            pslots = token_slots(page_table, torch.full_like(pools, seq), pools * kpool,
                                 page_size) // kpool
            keys = pool_keys[pslots].float()
            if pool_scales is not None:
                keys = keys * pool_scales[pslots][:, None]
            scores = indexer_scores_ref(q[t:t + 1], keys, w[t:t + 1], softmax_scale)[0]
            pools = scores.sort(descending=True, stable=True).indices[:topk_pools].sort().values
        tok = (pools[:, None] * kpool + torch.arange(kpool, device=q.device)).flatten()
        if select_tail:
            tail_len = (pos + 1) % kpool
            tok = torch.cat([tok, torch.arange(pos + 1 - tail_len, pos + 1, device=q.device)])
        out[t, : tok.numel()] = token_slots(page_table, torch.full_like(tok, seq), tok,
                                            page_size)
    return out


def kda_replay_ref(recurrent: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor,
                   k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   commit_lens: torch.Tensor) -> None:
    """ReplaySSM commit: ``recurrent[slots[i]]`` advanced in place by the first
    ``commit_lens[i]`` steps recorded in ring row ``rows[i]``.

    Ring (one KDA layer): k, g [R, D, H, K] fp32 (k normalised); v [R, D, H, V]; beta [R, D, H].
    recurrent: [S, H, K, V]. Each request runs ``kda.ref.kda_recurrent_ref`` over its accepted
    prefix in fp32 and is rounded once to the state dtype. Lengths are clamped to 0..D; a request
    with no step to replay (length 0, or row -1: no ring row bound) keeps its state bitwise.
    """
    width = k.shape[1]
    for slot, row, c in zip(slots.tolist(), rows.tolist(), commit_lens.tolist(), strict=True):
        c = min(max(c, 0), width)
        if c == 0 or row < 0:
            continue
        steps = [t[row : row + 1, :c] for t in (k, v, g, beta)]  # batch of one, c steps
        # q = k: only the final state is wanted, the outputs are discarded
        _, final = kda_recurrent_ref(steps[0], *steps, recurrent[slot : slot + 1].float())
        recurrent[slot] = final[0].to(recurrent.dtype)
