"""The data a speculative cycle passes around, and the two interfaces it is written against.

- ``SpecRequest``: one request's speculative progress (committed length, anchor, output).
- ``Proposal``: a drafter's drafts [N, S] and, for sampled drafts, the proposal distributions.
- ``TargetStates``: the target rows a drafter learns from after a forward (prefill or a commit):
  per request the committed positions' final hidden states and captured layer features, the token
  at each position and the token that follows it.
- ``CacheLayout``: where a request's rows live (plans, token slots) and how a target step runs.
  ``SessionLayout`` serves a ``Session``; the engine's runs every step through its
  ``ModelRunner`` (``glmlab.speculative.engine_phase``).
- ``Drafter``: ``extend`` (learn committed positions: MTP's draft-extend, DFlash2's KV projection),
  ``propose``, ``release``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from glmlab.cache.storage import ModelCache
from glmlab.core import SamplingParams
from glmlab.model.plan import ForwardPlan, StepPlan, StepResult, VerifyRecorder


@dataclass
class SpecRequest:
    row: int  # state slot (and page-table row) of the request in its layout
    params: SamplingParams
    committed: int = 0  # tokens whose KV and state are in the cache
    anchor: int = -1  # the next token to feed: sampled, not yet in the cache
    output: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None
    finished: bool = False


@dataclass(frozen=True)
class Proposal:
    tokens: torch.Tensor  # [N, S] int64
    draft_probs: torch.Tensor | None = None  # [N, S, V] for sampled drafts; None = point mass


@dataclass(frozen=True)
class TargetStates:
    positions: list[int]  # per request: position of its first row
    hidden: list[torch.Tensor]  # per request [n_i, D]: final normalised hidden states
    features: list[torch.Tensor]  # per request [n_i, F]: captured layer outputs, concatenated
    tokens: list[list[int]]  # per request: the token at each position
    next_tokens: list[list[int]]  # per request: the token after each position


class CacheLayout(Protocol):
    cache: ModelCache

    def plan(self, rows: list[int], seq_lens: list[int], cache_lens: list[int],
             verify: VerifyRecorder | None = None) -> ForwardPlan: ...

    def forward(self, plan: StepPlan) -> StepResult: ...

    def token_slots(self, row: int, start: int, end: int) -> torch.Tensor: ...

    def capacity(self, row: int) -> int: ...


class Drafter(Protocol):
    width: int  # verify window D: anchor + S drafts
    capture_layers: tuple[int, ...]  # target layers whose outputs ``extend`` reads

    def extend(self, reqs: list[SpecRequest], states: TargetStates) -> None: ...

    def propose(self, reqs: list[SpecRequest]) -> Proposal: ...

    def release(self, reqs: list[SpecRequest]) -> None: ...
