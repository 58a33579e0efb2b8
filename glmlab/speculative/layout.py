"""``SessionLayout``: the ``CacheLayout`` of a ``glmlab.model.session.Session``.

A session gives sequence i page-table row i, state slot i and ``max_len`` contiguous token slots,
so rows, slots and capacities are fixed. It lets the speculative cycle run on the bare model and
its cache, with no scheduler: the reference harness for losslessness tests and notebooks.
"""

from __future__ import annotations

import torch

from glmlab.model.plan import ForwardPlan, StepPlan, StepResult, VerifyRecorder
from glmlab.model.session import Session, run_step


class SessionLayout:
    def __init__(self, session: Session):
        self.session = session
        self.cache = session.cache

    def plan(self, rows: list[int], seq_lens: list[int], cache_lens: list[int],
             verify: VerifyRecorder | None = None) -> ForwardPlan:
        for r, n, c in zip(rows, seq_lens, cache_lens, strict=True):
            if c + n > self.session.max_len:
                raise ValueError(f"sequence {r}: {c} + {n} tokens exceed max_len "
                                 f"{self.session.max_len}")
        s = self.session
        return ForwardPlan.build(seq_lens, cache_lens, rows, s.page_table[rows], s.page_size,
                                 verify=verify)

    def forward(self, plan: StepPlan) -> StepResult:
        return run_step(self.session.model, self.cache, plan)

    def token_slots(self, row: int, start: int, end: int) -> torch.Tensor:
        s = self.session
        pos = torch.arange(start, end, device=s.page_table.device)
        return s.page_table[row, pos // s.page_size] * s.page_size + pos % s.page_size

    def capacity(self, row: int) -> int:
        return self.session.max_len

    def set_length(self, row: int, length: int) -> None:
        """Keep the session's own bookkeeping equal to the committed length."""
        self.session.lengths[row] = length
