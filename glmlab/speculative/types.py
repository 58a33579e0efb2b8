"""The data a speculative cycle passes around, and the two interfaces it is written against.

- ``SpecRequest``: one request's speculative progress (committed length, anchor, output).
- ``Proposal``: a drafter's drafts [N, S] and, for sampled drafts, the proposal distributions.
- ``TargetStates``: the target rows a drafter learns from after a forward (prefill or a commit):
  per request the committed positions' final hidden states and captured layer features, the token
  at each position and the token that follows it. After a verify it also carries the whole
  ``VerifyWindow`` (a drafter may learn over the uniform window and commit, as the target does).
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
from glmlab.speculative.commit import SpecStateStore


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
class VerifyWindow:
    """The uniform verify window a cycle's ``TargetStates`` were cut from, on the device.

    Request i verified positions p_i .. p_i+D-1 (p_i = ``TargetStates.positions[i]``) and keeps
    the first ``commit_lens[i]`` of them. A drafter can learn all D rows as one uniform step (the
    fused, host-sync-free path) instead of the ragged committed prefixes, provided it rolls its own
    carried state to the commit lengths afterwards: ``store`` recorded the verify and can record
    and roll the drafter's layers too (``SpecStateStore.commit_index_tails``)."""

    hidden: torch.Tensor  # [N, D, H] the target's final hidden states over every window row
    next_ids: torch.Tensor  # [N, D] int64: the token after row j, valid for j < commit_lens[i]
    commit_lens: torch.Tensor  # [N] int64, 1..D: window rows that became permanent
    store: SpecStateStore  # the verify's recorder (a ``VerifyRecorder``), bound to the same slots


@dataclass(frozen=True)
class TargetStates:
    positions: list[int]  # per request: position of its first row
    hidden: list[torch.Tensor]  # per request [n_i, D]: final normalised hidden states
    features: list[torch.Tensor]  # per request [n_i, F]: captured layer outputs, concatenated
    tokens: list[list[int]]  # per request: the token at each position
    next_tokens: list[list[int]]  # per request: the token after each position
    # Set by ``SpecDecoder.cycle`` only (the committed prefixes above are cut from it); None for
    # ragged learning (a prompt, an engine prefill chunk), where no window exists.
    window: VerifyWindow | None = None


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
