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

``apply_token_mask_ref`` sets row ``idx[i]`` of ``x`` to -inf wherever bit ``v % 32`` of word
``v // 32`` of ``bitmask[i]`` [M, ceil(V/32)] int32 is 0 (a grammar's allowed next tokens, the
layout xgrammar fills).
"""

from __future__ import annotations

import torch

_MASK = float("-inf")


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
