"""The logit adjustments of the batched sampler, in torch: the specification of the kernels.

``apply_penalties_ref`` adjusts rows ``idx`` of ``x`` [N, V] (fp32 logits) in place with the
per-request tables at rows ``rows`` (of the sampler's state, one row per adjusted request):

    used  = counts > 0  or  prompt                  (the token appeared in prompt or output)
    x     = x / rep if x > 0 else x * rep,  where used          (HF repetition penalty)
    x     = x - freq * counts - pres * (counts > 0) + bias      (OpenAI penalties, logit_bias)
    x     = -inf  where stops and early                (stop tokens before min_new_tokens)

Shapes: ``idx``, ``rows`` [M] int64; ``counts``, ``bias`` [S, V] fp32; ``prompt``, ``stops``
[S, V] bool; ``rep``, ``freq``, ``pres`` [M] fp32; ``early`` [M] bool (M adjusted rows, S table
rows). The order of operations is part of the contract: the kernel computes exactly this.

``race_ref`` draws one token per row by the exponential race: the token maximising
``scores - log(-log u)`` (a Gumbel-max draw, equal to ``argmax(p / E)`` with ``E = -log u`` for
``scores = log p`` up to a constant per row), ``u = seeded_uniform(seed, position, token)``, ties to
the lower token id. With ``scores = logits / T`` no softmax is needed at all: the draw is one pass.

``apply_token_mask_ref`` sets row ``idx[i]`` of ``x`` to -inf wherever bit ``v % 32`` of word
``v // 32`` of ``bitmask[i]`` [M, ceil(V/32)] int32 is 0 (a grammar's allowed next tokens, the
layout xgrammar fills).
"""

from __future__ import annotations

import torch

_MASK = float("-inf")
# splitmix64's constants as signed int64 (int64 products wrap on every torch device and in Triton)
GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15
MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
MIX2 = -7723592293110705685  # 0x94D049BB133111EB


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def seeded_uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N, vocab] uniforms in (0, 1): a splitmix64 hash of (seed, position, token id) per row."""
    dev = seeds.device
    key = seeds.long() * GOLDEN + positions.long() * MIX2
    x = key[:, None] + torch.arange(vocab, device=dev, dtype=torch.long)[None, :] * GOLDEN
    x = (x ^ _shr(x, 30)) * MIX1
    x = (x ^ _shr(x, 27)) * MIX2
    x = x ^ _shr(x, 31)
    return (_shr(x, 40).float() + 0.5) * (1.0 / (1 << 24))


def race_ref(x: torch.Tensor, idx: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
             positions: torch.Tensor) -> torch.Tensor:
    """[M] int64 tokens: rows ``idx`` [M] of fp32 logits ``x`` [N, V] at ``temperature`` [M]
    (fp32), raced with the uniforms of ``seeds`` / ``positions`` [M] (int64)."""
    scores = x[idx] / temperature[:, None]
    u = seeded_uniform(seeds, positions, x.shape[-1])
    return (scores - torch.log(-torch.log(u))).argmax(-1)


def apply_penalties_ref(x: torch.Tensor, idx: torch.Tensor, rows: torch.Tensor,
                        counts: torch.Tensor, prompt: torch.Tensor, bias: torch.Tensor,
                        stops: torch.Tensor, rep: torch.Tensor, freq: torch.Tensor,
                        pres: torch.Tensor, early: torch.Tensor) -> None:
    c, seen = counts[rows], prompt[rows]  # [M, V]
    sub = x[idx]  # [M, V]
    used = (c > 0) | seen
    sub = torch.where(used, torch.where(sub > 0, sub / rep[:, None], sub * rep[:, None]), sub)
    sub = sub - freq[:, None] * c - pres[:, None] * (c > 0).float() + bias[rows]
    sub = sub.masked_fill(stops[rows] & early[:, None], _MASK)
    x[idx] = sub


def apply_token_mask_ref(x: torch.Tensor, idx: torch.Tensor, bitmask: torch.Tensor) -> None:
    ids = torch.arange(x.shape[-1], device=x.device)
    allowed = ((bitmask[:, ids // 32] >> (ids % 32)) & 1).bool()  # [M, V]
    x[idx] = x[idx].masked_fill(~allowed, _MASK)


def logprob_table_ref(logits: torch.Tensor, tokens: torch.Tensor, top: int,
                      topk=None) -> torch.Tensor:
    """[N, 1 + 2 * top]: row i is the log-softmax of fp32 ``logits`` [N, V] at ``tokens[i]``
    ([N] int64), then the ``top`` largest log-softmax values (descending), then their token
    ids, in one float dtype that holds the ids exactly (fp32 below 2**24 tokens, else fp64).
    ``topk(x, k) -> (values, ids)`` picks the top (default ``torch.topk``; the engine's torch
    sampler passes its two-stage ``glmlab.sampling.top_k``). x - logsumexp(x), gathered and
    top-k'd from the raw logits: the numbers of a log_softmax without writing the whole [N, V]
    of it. The specification of ``logprobs_triton``."""
    x = logits.float()
    lse = torch.logsumexp(x, -1, keepdim=True)
    wide = torch.float32 if x.shape[-1] < (1 << 24) else torch.float64
    picked = (x.gather(-1, tokens[:, None]) - lse).to(wide)
    if not top:
        return picked
    values, ids = topk(x, top) if topk is not None else x.topk(top, dim=-1)
    return torch.cat([picked, (values - lse).to(wide), ids.to(wide)], 1)
