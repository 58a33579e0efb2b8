"""The shared vocabulary of the serving stack: cache formats, sampling, request and output records.

Everything the cache, the model harnesses, the engine, speculation and the service pass to one
another is defined here, so each of them imports only downward (the layer order is written down
and enforced in ``tests/test_layers.py``):

- number formats of the caches (``ComputeDtype``, ``KVDtype``, ``IndexDtype``, ``StateDtype``) and
  the radix-cache mode (``RadixMode``): enums whose values are what a CLI flag or a log shows;
- ``SamplingParams``, validated on construction, and the sampler (temperature, top-k, top-p,
  greedy at temperature 0; logprobs of the raw logits);
- ``InvalidRequest``: the one error a request that cannot be served raises, naming its field;
- a request (``Req``) with integer progress, its cache lease (``SeqCache``), a step's ``Batch`` of
  ``Entry``s, ``CacheTarget`` (where a request's cache content lives, for PD transfers) and
  ``RequestOutput``, the one record a step yields per request.

A request's known tokens are ``token_ids`` (prompt, then outputs); ``computed_len`` of them have
their KV and state in the cache. Every step extends a request by ``extend_len`` tokens or a chunk
of them (prefill, the last sampled token, or a recompute after preemption): compute
``token_ids[computed_len : computed_len + n]`` and, if that reaches the end, sample the next token.

This module knows torch (the sampler) and nothing else of glmlab.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import torch


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


# ---------------------------------------------------------------------------------- sampling
class InvalidRequest(ValueError):
    """A request that cannot be served as asked; ``field`` names the offending input."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None  # None = off; k >= 0: the sampled token's, and the k most likely
    skip_special_tokens: bool = True  # in the output text
    include_stop_str: bool = False  # keep a matched stop string at the end of the text
    # glmlab.sampling: batched in the sampler, on the logits the forward returns
    n: int = 1  # samples of one prompt: one prefill, n decode streams sharing its KV pages
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one
    frequency_penalty: float = 0.0  # minus this x the times a token was output (OpenAI)
    presence_penalty: float = 0.0  # minus this once a token was output (OpenAI)
    repetition_penalty: float = 1.0  # logits of prompt and output tokens / this (> 0: x it)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    min_new_tokens: int = 0  # stop tokens and stop strings cannot end the output before this
    prompt_logprobs_from: int | None = None  # logprobs of prompt tokens from this position on

    def __post_init__(self) -> None:
        self._check_basic()
        self._check_extended()

    def _check_extended(self) -> None:
        def bad(name: str, message: str):
            raise InvalidRequest(name, f"{name} {message}")

        if not 1 <= self.n <= MAX_SAMPLES:
            bad("n", f"must be in [1, {MAX_SAMPLES}], got {self.n}")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", f"must be in [0, 1], got {self.min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                bad(name, f"must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            bad("repetition_penalty", f"must be in (0, 2], got {self.repetition_penalty}")
        for token, bias in self.logit_bias:
            if not -100.0 <= bias <= 100.0:
                bad("logit_bias", f"values must be in [-100, 100], got {bias} for token {token}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            bad("min_new_tokens", f"must be in [0, max_new_tokens={self.max_new_tokens}], "
                f"got {self.min_new_tokens}")
        if self.prompt_logprobs_from is not None and self.prompt_logprobs_from < 0:
            bad("prompt_logprobs_from", f"must be >= 0, got {self.prompt_logprobs_from}")

    @property
    def penalized(self) -> bool:
        return (self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or self.repetition_penalty != 1.0)

    @property
    def adjusts_logits(self) -> bool:
        """Anything the sampler changes beyond temperature / top-k / top-p / min-p."""
        return self.penalized or bool(self.logit_bias) or self.min_new_tokens > 0

    def _check_basic(self) -> None:
        def bad(name: str, message: str):
            raise InvalidRequest(name, f"{name} {message}")

        if not (self.temperature >= 0.0) or self.temperature != self.temperature:
            bad("temperature", f"must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            bad("top_k", f"must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 1:
            bad("max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        if self.seed is not None and self.seed < 0:
            bad("seed", f"must be >= 0, got {self.seed}")
        if any(not s for s in self.stop):
            bad("stop", "strings must be non-empty")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            bad("logprobs", f"must be in [0, {MAX_TOP_LOGPROBS}] (or unset), got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI's limit)
MAX_SAMPLES = 128  # n: samples of one prompt


@dataclass(frozen=True)
class TokenLogprob:
    """log-softmax of the raw logits at one output token, and the ``top`` most likely tokens
    there as (token id, logprob), most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    def with_top(self, k: int) -> TokenLogprob:
        return self if len(self.top) <= k else TokenLogprob(self.token_id, self.logprob,
                                                             self.top[:k])


class GrammarMatcher(Protocol):
    """One request's position in a grammar (``glmlab.grammar`` wraps xgrammar): which tokens may
    come next, as a bitmask row of int32 words (bit t of word t // 32 set: token t allowed)."""

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None: ...

    def accept(self, token: int) -> bool: ...

    def is_terminated(self) -> bool: ...


@dataclass(frozen=True)
class Sampled:
    """What sampling gave one entry of a step: its token (a verify window: the emitted tokens,
    accepted drafts then the bonus), with one logprob per token when the request asked."""

    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None = None


def make_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator | None:
    if params.greedy:
        return None
    gen = torch.Generator(device)
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


def sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
    """One token from fp32 logits [V]."""
    if params.greedy:
        return int(logits.argmax())
    probs = filtered_probs(logits, params)
    return int(torch.multinomial(probs, 1, generator=gen))


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution sampling draws from: softmax(logits / T) restricted by top-k and top-p."""
    x = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = x.softmax(-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """Logprobs of ``tokens[i]`` under row i of raw logits [N, V], with ``top`` alternatives."""
    if not tokens:
        return []
    lp = torch.log_softmax(logits.float(), -1)
    picked = lp.gather(-1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
    if top:
        values, ids = lp.topk(top, dim=-1)
        alts = [tuple(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(),
                                                                strict=True)]
    else:
        alts = [()] * len(tokens)
    return [TokenLogprob(t, p, a) for t, p, a in zip(tokens, picked, alts, strict=True)]


def sample_rid(rid: str, index: int) -> str:
    """The request id of sample ``index`` of a request with ``params.n`` samples."""
    return rid if index == 0 else f"{rid}#{index}"


# ---------------------------------------------------------------------------------- requests
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
