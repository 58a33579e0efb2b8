"""Simulated acceptance: cycle-time studies on random weights, where real drafts are never accepted.

With random weights a drafter almost never matches the target, so a benchmark would measure cycles
that commit one token. ``SimulatedAcceptance`` instead decides how many drafts each request accepts
(the verify forward and every commit still run in full): the emitted tokens are then the accepted
drafts plus the target's argmax after them, which is **not** the target's own output. Every result
that used it carries ``simulated=True`` (sglang's equivalent is ``SGLANG_SIMULATE_ACC_LEN``).

Modes, for a mean commit length m (accepted drafts + bonus, the reference deployment's "acceptance
length"):
- ``fixed``: each request commits floor(m) or ceil(m), mixed deterministically so the running mean
  tracks m (7.03 -> 97 cycles of 7 and 3 of 8 per 100);
- ``sampled``: every draft is accepted with one constant probability a, chosen so that
  E[commit] = 1 + a + a^2 + ... + a^S = m; the commit length is 1 + the run of leading accepts.
"""

from __future__ import annotations

import math

import torch

from glmlab.speculative.verify import Accepted


def acceptance_rate(mean_commit: float, num_drafts: int) -> float:
    """The per-draft rate a with sum_{i=0..S} a^i = mean_commit (bisection; monotone in a)."""
    if not 1.0 <= mean_commit <= num_drafts + 1:
        raise ValueError(f"mean commit length {mean_commit} outside [1, {num_drafts + 1}]")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(num_drafts + 1)) < mean_commit:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class SimulatedAcceptance:
    def __init__(self, mean_commit: float, width: int, mode: str = "fixed", seed: int = 0):
        if mode not in ("fixed", "sampled"):
            raise ValueError(f"simulated acceptance mode must be fixed or sampled, got {mode!r}")
        self.mean_commit, self.width, self.mode = mean_commit, width, mode
        self.rate = acceptance_rate(mean_commit, width - 1)
        self._credit = 0.0
        self._gen = torch.Generator().manual_seed(seed)

    def commit_lens(self, n: int) -> torch.Tensor:
        """[n] simulated commit lengths in 1..width."""
        if self.mode == "sampled":
            ok = torch.rand(n, self.width - 1, generator=self._gen) < self.rate
            return ok.long().cumprod(-1).sum(-1) + 1
        base, frac = math.floor(self.mean_commit), self.mean_commit % 1.0
        out = []
        for _ in range(n):
            self._credit += frac
            extra = self._credit >= 1.0 - 1e-9
            self._credit -= float(extra)
            out.append(min(self.width, base + int(extra)))
        return torch.tensor(out, dtype=torch.long)

    def accept(self, target_logits: torch.Tensor, drafts: torch.Tensor) -> Accepted:
        """Accept the simulated number of drafts; the token after them is the target's argmax."""
        n = drafts.shape[0]
        lens = self.commit_lens(n).to(drafts.device) - 1
        best = target_logits.argmax(-1)  # [N, S+1]
        tokens = torch.cat([drafts, best[:, -1:]], dim=1)
        rows = torch.arange(n, device=drafts.device)
        tokens[rows, lens] = best[rows, lens]
        return Accepted(lens, tokens)
