"""Verification: which drafted tokens a target forward accepts, and the token that follows them.

A verify window is ``[anchor, d_1 .. d_S]`` (D = S + 1 tokens); the target's logits at window
position j predict the token after it, so row j judges draft d_{j+1} and row S yields the bonus.
Every function returns ``Accepted(accept_lens, tokens)``: ``accept_lens[i]`` drafts were accepted
(0..S) and ``tokens[i, :accept_lens[i] + 1]`` are the tokens emitted this cycle (the accepted
drafts, then one target token). The commit length (what the cache keeps of the window, anchor
included) is ``accept_lens + 1``; the reference deployment's "acceptance length" is its mean.

- greedy: the longest prefix of drafts equal to the target's argmax, plus the argmax after it.
  The emitted tokens are the target's own argmax tokens, so the output equals plain greedy decoding.
- sampling: standard speculative rejection sampling against the proposal the drafter actually
  sampled from (``draft_probs`` [N, S, V]): accept d with probability min(1, p(d)/q(d)); on the
  first rejection draw from norm(max(p - q, 0)); after a full accept draw from p. A point-mass
  drafter (greedy MTP chain, greedy DFlash walk) passes ``draft_probs=None``: q is one-hot, so
  acceptance is p(d) and the residual is p without d (sglang's target-only chain sampling). Either
  way the emitted tokens are distributed exactly as sampling the target token by token (tested).

Target probabilities come from ``glmlab.core.filtered_probs`` (temperature, top-k, top-p),
so a request's sampling parameters mean the same thing with and without speculation. This module
knows nothing about drafters, caches or requests beyond these tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glmlab.core import SamplingParams, filtered_probs


@dataclass(frozen=True)
class Accepted:
    accept_lens: torch.Tensor  # [N] int64, accepted drafts (0..S)
    tokens: torch.Tensor  # [N, S+1] int64; row i is valid up to accept_lens[i] (inclusive)

    @property
    def commit_lens(self) -> torch.Tensor:
        """Window tokens that become permanent: the anchor plus the accepted drafts."""
        return self.accept_lens + 1

    def emitted(self, i: int) -> list[int]:
        return self.tokens[i, : int(self.accept_lens[i]) + 1].tolist()


def _prefix_len(ok: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True per row: ok [N, S] -> [N]."""
    return ok.long().cumprod(dim=-1).sum(dim=-1)


def greedy_accept(target_logits: torch.Tensor, drafts: torch.Tensor) -> Accepted:
    """target_logits [N, S+1, V], drafts [N, S] -> longest matching prefix plus the bonus argmax."""
    best = target_logits.argmax(dim=-1)  # [N, S+1]
    return Accepted(_prefix_len(drafts == best[:, :-1]), best)


def rejection_accept(target_probs: torch.Tensor, drafts: torch.Tensor,
                     draft_probs: torch.Tensor | None,
                     generator: torch.Generator | None = None) -> Accepted:
    """Speculative sampling of one chain per row.

    Args:
        target_probs: [N, S+1, V] the target's (filtered) next-token distributions over the window.
        drafts: [N, S] proposed tokens, drawn from ``draft_probs`` (or deterministic if None).
        draft_probs: [N, S, V] the proposal distribution each draft was drawn from, or None for
            point-mass drafts.
        generator: source of the uniforms and of the residual / bonus draws.
    Returns:
        ``Accepted``; tokens after the emitted prefix are unspecified.
    """
    n, s = drafts.shape
    p = target_probs.float()
    if draft_probs is None:
        q = torch.zeros_like(p[:, :s]).scatter_(-1, drafts[..., None], 1.0)
    else:
        q = draft_probs.float()
    p_d = p[:, :s].gather(-1, drafts[..., None])[..., 0]  # [N, S]
    q_d = q.gather(-1, drafts[..., None])[..., 0]
    u = torch.rand(n, s, generator=generator, device=p.device)
    accept = _prefix_len(u * q_d < p_d)  # u < p/q without dividing by a zero q
    # Distribution of the token after the accepted prefix: the residual at the first rejection,
    # or the target row itself after a full accept.
    residual = (p[:, :s] - q).clamp(min=0)
    residual = torch.cat([residual, p[:, s:]], dim=1)  # [N, S+1, V]
    rows = torch.arange(n, device=p.device)
    row = residual[rows, accept]  # [N, V]
    mass = row.sum(-1, keepdim=True)
    # p == q exactly leaves no residual; a rejection then has probability 0, so any row will do.
    row = torch.where(mass > 0, row / mass.clamp(min=1e-30), p[rows, accept])
    bonus = torch.multinomial(row, 1, generator=generator)[:, 0]
    tokens = torch.cat([drafts, drafts.new_zeros(n, 1)], dim=1)
    tokens[rows, accept] = bonus
    return Accepted(accept, tokens)


def accept(target_logits: torch.Tensor, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
           params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> Accepted:
    """Verify a batch whose requests may mix greedy and sampled decoding.

    target_logits [N, S+1, V] fp32; drafts [N, S]; draft_probs [N, S, V] or None; one
    ``SamplingParams`` and one generator per request (None for greedy requests).
    """
    out = greedy_accept(target_logits, drafts)
    sampled = [i for i, sp in enumerate(params) if not sp.greedy]
    if not sampled:
        return out
    lens, tokens = out.accept_lens.clone(), out.tokens.clone()
    for i in sampled:  # per request: each draws from its own seeded generator
        probs = filtered_probs(target_logits[i], params[i])[None]
        q = None if draft_probs is None else draft_probs[i:i + 1]
        one = rejection_accept(probs, drafts[i:i + 1], q, generators[i])
        lens[i], tokens[i] = one.accept_lens[0], one.tokens[0]
    return Accepted(lens, tokens)
