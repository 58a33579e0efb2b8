"""The shared vocabulary of the serving stack: cache formats, sampling, request and output records.

Everything the cache, the model harnesses, the engine, speculation and the service pass to one
another is importable from here, so each of them imports only downward (the layer order is
written down and enforced in ``tests/test_layers.py``):

- number formats of the caches (``ComputeDtype``, ``KVDtype``, ``IndexDtype``, ``StateDtype``) and
  the radix-cache mode (``RadixMode``): enums whose values are what a CLI flag or a log shows;
- ``SamplingParams``, validated on construction, and the sampler (temperature, top-k, top-p,
  greedy at temperature 0; logprobs of the raw logits); ``InvalidRequest``: the one error a
  request that cannot be served raises, naming its field. These are defined in
  ``glmlab.sampling_params`` and re-exported here: import them from ``glmlab.core``;
- ``GrammarMatcher``: what constrained decoding asks of a request's grammar;
- a request (``Req``) with integer progress, its cache lease (``SeqCache``), a step's ``Batch`` of
  ``Entry``s, ``CacheTarget`` (where a request's cache content lives, for PD transfers) and
  ``RequestOutput``, the one record a step yields per request.

A request's known tokens are ``token_ids`` (prompt, then outputs); ``computed_len`` of them have
their KV and state in the cache. Every step extends a request by ``extend_len`` tokens or a chunk
of them (prefill, the last sampled token, or a recompute after preemption): compute
``token_ids[computed_len : computed_len + n]`` and, if that reaches the end, sample the next token.

This module knows torch (the grammar bitmask) and ``glmlab.sampling_params``, nothing else of
glmlab.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import torch

# SamplingParams and the sampler live in their own module; every caller imports them from here.
from glmlab.sampling_params import (  # noqa: F401
    MAX_SAMPLES,
    MAX_TOP_LOGPROBS,
    InvalidRequest,
    Sampled,
    SamplingParams,
    TokenLogprob,
    filtered_probs,
    make_generator,
    sample,
    sample_rid,
)


# ---------------------------------------------------------------------------------- formats
class _Choice(str, Enum):
    def __str__(self) -> str:  # "fp8", not "KVDtype.FP8": what a CLI flag or a log shows
        return self.value


class ComputeDtype(_Choice):
    AUTO = "auto"  # bf16 on CUDA, fp32 on CPU
    BF16 = "bf16"
    FP32 = "fp32"


class KVDtype(_Choice):
    AUTO = "auto"  # the model dtype: bit-for-bit the reference numerics
    BF16 = "bf16"
    FP8 = "fp8"  # E4M3 latent with one fp32 scale per 128 channels (528 B/token/layer)


class IndexDtype(_Choice):
    AUTO = "auto"  # pooled indexer keys in the model dtype
    FP8 = "fp8"  # E4M3 + one fp32 scale per pooled key (33 B/token amortised), as SGLang


class StateDtype(_Choice):
    FP32 = "fp32"
    BF16 = "bf16"


class RadixMode(_Choice):
    OFF = "off"
    KV_AND_STATE = "kv_and_state"  # prefix KV + KDA state checkpoints at page boundaries
    KV_ONLY = "kv_only"  # prefix KV only; requests bring their own end-of-prompt state


class FP8Weights(_Choice):
    DEQUANTIZE = "dequantize"  # block-FP8 checkpoint weights widened at load: the reference
    KEEP = "keep"  # E4M3 + block scales kept for the block-FP8 GEMM kernels


# ---------------------------------------------------------------------------------- requests
class GrammarMatcher(Protocol):
    """One request's position in a grammar (``glmlab.grammar`` wraps xgrammar): which tokens may
    come next, as a bitmask row of int32 words (bit t of word t // 32 set: token t allowed)."""

    # the tokens whose acceptance can end the grammar (xgrammar: the tokenizer's stop tokens);
    # any other token the mask allowed is accepted without ending it, so the engine may tell
    # the matcher late, at the next mask fill, while that step's forward runs
    stop_token_ids: frozenset[int]

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None: ...

    def accept(self, token: int) -> bool: ...

    def is_terminated(self) -> bool: ...


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


@dataclass
class SeqCache:
    """A request's cache lease: a state slot and the pages covering its positions."""

    slot: int  # state slot (conv + recurrent + index tails)
    pages: list[int] = field(default_factory=list)  # pages[i] holds positions [i*S, (i+1)*S)
    prefix_len: int = 0  # tokens reused from the radix tree at admission
    # an imported prompt's n samples: slots of samples 1..n-1 (reserved at admission)
    sample_slots: list[int] = field(default_factory=list)


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
    matched_stop: int | str | None = None  # the stop token id or stop string that ended it
    seed: int = 0  # the batched sampler's draws: a function of (seed, position) alone
    sample_index: int = 0  # which of the prompt's ``params.n`` samples this is
    forked: bool = False  # params.n > 1: its siblings were made from it (or it is one)
    grammar: GrammarMatcher | None = None  # constrained decoding: the allowed next tokens
    grammar_pending: int | None = None  # emitted, not yet told to the grammar (next mask fill)
    grammar_refused: int | None = None  # a late-told token the grammar refused (never expected)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)

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
    sample_slots: tuple[int, ...] = ()  # an import of n samples: the slots of samples 1..n-1

    @property
    def transfer_pages(self) -> tuple[int, ...]:
        return self.pages[self.prefix_len // self.page_size:]


@dataclass(frozen=True)
class RequestOutput:
    """What one engine step produced for one request: new tokens, their text and logprobs.

    ``text_delta`` is settled text only: never a partial UTF-8 character, never text that could
    still turn out to start a stop string; a matched stop string is cut (unless the request asked
    ``include_stop_str``). Concatenated over a request's outputs it is the request's whole text.
    ``logprobs`` has one entry per new token when the request asked (``SamplingParams.logprobs``).
    """

    rid: str
    new_token_ids: tuple[int, ...]
    text_delta: str = ""
    logprobs: tuple[TokenLogprob, ...] | None = None
    cached_tokens: int = 0  # prompt tokens served from the radix tree
    finish_reason: FinishReason | None = None
    matched_stop: int | str | None = None  # the stop token id or string (finish_reason STOP)
    prompt_tokens: int = 0
    completion_tokens: int = 0  # output tokens so far, these included
    # on a request's first record when it asked (``prompt_logprobs_from``): one per prompt
    # position from there on, None where nothing precedes the token (position 0)
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
