"""A drafter that knows the answer: it proposes tokens of a given reference continuation.

With the target's own greedy continuation as the reference it proposes exactly what the target will
emit, so every draft is accepted and the full-acceptance path (commit length = verify width) of the
verifier, the state commit and the cache rollback are exercised. ``wrong`` marks positions where it
deliberately proposes a different token, which gives chosen, mixed accept lengths in one batch.
It has no model, no cache and no per-request state beyond the reference.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from glmlab.speculative.types import Proposal, SpecRequest, TargetStates


class OracleDrafter:
    capture_layers: tuple[int, ...] = ()

    def __init__(self, width: int, reference: dict[int, list[int]] | Callable[[int], list[int]],
                 vocab_size: int, wrong: Callable[[int, int], bool] | None = None,
                 device: str = "cpu"):
        """reference[row] (or reference(row)): the full token sequence (prompt + continuation)
        of the request in that row."""
        self.width, self.vocab_size, self.wrong, self.device = width, vocab_size, wrong, device
        self.reference = reference.__getitem__ if isinstance(reference, dict) else reference

    def extend(self, reqs: list[SpecRequest], states: TargetStates) -> None:
        """Nothing to learn: the reference is already known."""

    def propose(self, reqs: list[SpecRequest]) -> Proposal:
        rows = []
        for r in reqs:
            ref = self.reference(r.row)
            # the anchor sits at position ``committed``; drafts are the positions after it
            pos = range(r.committed + 1, r.committed + self.width)
            toks = [ref[p] if p < len(ref) else 0 for p in pos]
            if self.wrong is not None:
                toks = [(t + 1) % self.vocab_size if self.wrong(r.row, p) else t
                        for t, p in zip(toks, pos, strict=True)]
            rows.append(toks)
        return Proposal(torch.tensor(rows, dtype=torch.long, device=self.device))

    def release(self, reqs: list[SpecRequest]) -> None:
        """No per-request state."""
