"""The engine's data: requests with integer progress, batches of entries, step outputs. No tensors.

A request's known tokens are ``token_ids`` (prompt, then outputs); ``computed_len`` of them have
their KV and state in the cache. Every step extends a request by ``extend_len`` tokens or a chunk
of them: a whole prompt or a piece of it (prefill), the last sampled token (decode), or after a
preemption everything again (recompute). So one rule drives all three: compute
``token_ids[computed_len : computed_len + n]`` and, if that reaches the end, sample the next token.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from glmlab.cache.hybrid import SeqCache
from glmlab.engine.sampler import SamplingParams


class Phase(str, Enum):
    PREFILL = "prefill"  # prompt tokens (or recomputed ones)
    DECODE = "decode"  # the one token sampled last step
    VERIFY = "verify"  # speculative window: the last sampled token + drafts (glmlab.speculative)


class Status(str, Enum):
    WAITING = "waiting"  # queued, holds nothing
    RUNNING = "running"  # holds a cache lease, scheduled every step
    AWAITING_IMPORT = "awaiting_import"  # holds a lease whose content arrives from outside
    HELD = "held"  # prompt done, lease kept for export (prefill role)
    FINISHED = "finished"


class FinishReason(str, Enum):
    STOP = "stop"  # a stop token, EOS or stop string
    LENGTH = "length"  # max_new_tokens or the context length
    ABORT = "abort"
    PREFILLED = "prefilled"  # prefill role: first token out, cache held for export


@dataclass(eq=False)
class Req:
    rid: str
    token_ids: list[int]  # prompt, then outputs
    num_prompt: int
    params: SamplingParams
    max_len: int  # token_ids never grows past this (prompt + max_new_tokens, within the context)
    stop_ids: frozenset[int]
    generator: torch.Generator | None = None
    imported: bool = False  # brings its own cache content (prefill ran elsewhere)
    hold_after_prefill: bool = False  # prefill role
    status: Status = Status.WAITING
    computed_len: int = 0
    cache: SeqCache | None = None
    cached_tokens: int = 0  # prompt tokens reused from the radix tree at first admission
    checkpoints: tuple[int, ...] = ()  # positions where a prefill chunk must end (kv_and_state)
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    stop_str: str | None = None  # the stop string that ended the request

    @property
    def prompt_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt]

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt:]

    @property
    def extend_len(self) -> int:
        return len(self.token_ids) - self.computed_len


@dataclass(frozen=True)
class Entry:
    """One request's share of a step: positions [start, start + num_tokens)."""

    req: Req
    start: int
    num_tokens: int
    phase: Phase
    samples: bool  # reaches the end of the known tokens: its last logits give the next token


@dataclass(frozen=True)
class Batch:
    entries: tuple[Entry, ...]
    step: int

    @property
    def phase(self) -> Phase:
        """PREFILL if any entry prefills (a mixed batch), else VERIFY if any entry verifies,
        else DECODE."""
        phases = {e.phase for e in self.entries}
        return next((p for p in (Phase.PREFILL, Phase.VERIFY) if p in phases), Phase.DECODE)

    @property
    def num_tokens(self) -> int:
        return sum(e.num_tokens for e in self.entries)

    def tokens_of(self, phase: Phase) -> int:
        return sum(e.num_tokens for e in self.entries if e.phase is phase)


@dataclass(frozen=True)
class StepOutput:
    rid: str
    new_token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: FinishReason | None = None
    stop_str: str | None = None


@dataclass(frozen=True)
class CacheTarget:
    """Where one request's cache content lives in an engine: what a transfer reads or writes.

    Pages cover positions [0, prompt_len); the first ``prefix_len`` tokens (whole pages) are
    shared with the radix tree and need no transfer. State (conv, recurrent, index tails) sits at
    ``state_slot``. Row addresses per region: ``ModelCache.regions``."""

    rid: str
    prompt_len: int
    prefix_len: int
    pages: tuple[int, ...]
    state_slot: int
    page_size: int

    @property
    def transfer_pages(self) -> tuple[int, ...]:
        return self.pages[self.prefix_len // self.page_size:]
