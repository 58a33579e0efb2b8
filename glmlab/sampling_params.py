"""What a request asks of sampling, what sampling gives back, and the one-request sampler.

- ``SamplingParams``, validated on construction; ``InvalidRequest``, the one error a request that
  cannot be served raises, naming its field (the engine raises it for prompts too);
- ``TokenLogprob`` and ``Sampled``: a sampled token's logprob and one entry's sampled tokens;
- the one-request sampler (temperature, top-k, top-p, greedy at temperature 0; logprobs of the
  raw logits), which the reference paths and speculative verification use; the engine's batched
  sampler is ``glmlab.sampling``;
- ``sample_rid``: the request id of each of a prompt's ``n`` samples.

Import these names from ``glmlab.core``, the one home of the shared vocabulary: it re-exports
them. They live apart only to keep ``core.py`` to the request and output records. Like
``glmlab.core``, this module knows torch and nothing else of glmlab.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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


def sample_rid(rid: str, index: int) -> str:
    """The request id of sample ``index`` of a request with ``params.n`` samples."""
    return rid if index == 0 else f"{rid}#{index}"
