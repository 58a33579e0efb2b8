"""Request bodies of the three generation APIs, validated strictly, reduced to one ``GenRequest``.

SGLang-native ``POST /generate``, OpenAI ``POST /v1/completions`` and ``POST /v1/chat/completions``.
Types are strict (a string is not a number, a float is not an int). Unknown top-level fields are
tolerated, because sglang-router adds its own (``bootstrap_*``, ``log_metrics``, ``no_logs``...);
unknown *sampling* parameters are rejected (SGLang does the same), and known parameters that
glmlab does not implement (penalties, n > 1, constrained decoding...) are rejected with their name
rather than silently ignored.

Validation of values (temperature range, ...) is the engine's (``SamplingParams``, then
``Engine.add_request`` for the prompt), so HTTP and ``LLM`` accept and reject the same things.
This module knows request shapes only: no tokenizer, no engine, no HTTP.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from glmlab.core import InvalidRequest, SamplingParams
from glmlab.serve.errors import RequestError


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class SglSamplingParams(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    custom_params: dict | None = None
    logit_bias: dict | None = None


class GenerateBody(_Strict):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SglSamplingParams = Field(default_factory=SglSamplingParams)
    stream: bool = False
    rid: str | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    model: str | None = None
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    include_usage: bool = False


class _OpenAIBody(_Strict):
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict | None = None
    user: str | None = None
    rid: str | None = None
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None


class CompletionBody(_OpenAIBody):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "observation"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatBody(_OpenAIBody):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list | None = None
    response_format: dict | None = None
    continue_final_message: bool = False


# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bootstrap:
    host: str
    port: int
    room: int


@dataclass(frozen=True)
class GenRequest:
    """What every API reduces to: one prompt (text or ids) and how to continue it (the engine's
    ``SamplingParams``, which also say whether logprobs and which text are wanted)."""

    rid: str
    text: str | None
    input_ids: tuple[int, ...] | None
    params: SamplingParams
    stream: bool
    bootstrap: Bootstrap | None

    @property
    def return_logprob(self) -> bool:
        return self.params.logprobs is not None


def _unsupported(name: str, value, default) -> None:
    if value != default and value is not None:
        raise RequestError(f"{name}={value!r} is not supported by glmlab (only {default!r})",
                           param=name)


def _bootstrap(body) -> Bootstrap | None:
    got = (body.bootstrap_host, body.bootstrap_port, body.bootstrap_room)
    if all(v is None for v in got):
        return None
    if body.bootstrap_host is None or body.bootstrap_room is None:
        raise RequestError("bootstrap_host and bootstrap_room must come together",
                           param="bootstrap_room")
    if body.bootstrap_port is None:
        raise RequestError("bootstrap_port is null: start the router with the prefill's "
                           "bootstrap port (--prefill URL PORT)", param="bootstrap_port")
    if body.bootstrap_room < 0:
        raise RequestError("bootstrap_room must be >= 0", param="bootstrap_room")
    return Bootstrap(body.bootstrap_host, body.bootstrap_port, body.bootstrap_room)


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    return (stop,) if isinstance(stop, str) else tuple(stop or ())


def _params(*, temperature, top_p, top_k, min_p, max_new_tokens, stop, stop_token_ids,
            ignore_eos, seed, logprob: bool, skip_special_tokens: bool,
            no_stop_trim: bool) -> SamplingParams:
    _unsupported("min_p", min_p, 0.0)
    try:
        return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                              max_new_tokens=max_new_tokens, stop=_stops(stop),
                              stop_token_ids=tuple(stop_token_ids or ()), ignore_eos=ignore_eos,
                              seed=seed, logprobs=0 if logprob else None,
                              skip_special_tokens=skip_special_tokens,
                              include_stop_str=no_stop_trim)
    except InvalidRequest as e:
        raise RequestError(str(e), param=e.field) from e


def _first(*values):
    return next(v for v in values if v is not None)


def _rid(rid: str | None) -> str:
    return rid or uuid.uuid4().hex


def from_generate(body: GenerateBody) -> GenRequest:
    if isinstance(body.text, list) or (body.input_ids and isinstance(body.input_ids[0], list)):
        raise RequestError("batch requests (a list of prompts) are not supported: "
                           "send one request per prompt", param="text")
    if (body.text is None) == (body.input_ids is None):
        raise RequestError("give exactly one of text or input_ids", param="text")
    sp = body.sampling_params
    for name, default in (("n", 1), ("min_new_tokens", 0), ("frequency_penalty", 0.0),
                          ("presence_penalty", 0.0), ("repetition_penalty", 1.0), ("regex", None),
                          ("json_schema", None), ("ebnf", None), ("structural_tag", None),
                          ("logit_bias", None)):
        _unsupported(name, getattr(sp, name), default)
    if body.top_logprobs_num:
        raise RequestError("top_logprobs_num is not supported (only the sampled token's "
                           "logprob)", param="top_logprobs_num")
    params = _params(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k, min_p=sp.min_p,
                     max_new_tokens=sp.max_new_tokens, stop=sp.stop,
                     stop_token_ids=sp.stop_token_ids, ignore_eos=sp.ignore_eos,
                     seed=sp.sampling_seed if sp.sampling_seed is not None else sp.seed,
                     logprob=body.return_logprob, skip_special_tokens=sp.skip_special_tokens,
                     no_stop_trim=sp.no_stop_trim)
    return GenRequest(_rid(body.rid), body.text,
                      None if body.input_ids is None else tuple(body.input_ids), params,
                      body.stream, _bootstrap(body))


def _openai_common(body: _OpenAIBody, max_tokens: int, logprob: bool) -> SamplingParams:
    for name, default in (("n", 1), ("frequency_penalty", 0.0), ("presence_penalty", 0.0),
                          ("logit_bias", None)):
        _unsupported(name, getattr(body, name), default)
    return _params(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                   min_p=body.min_p, max_new_tokens=max_tokens, stop=body.stop,
                   stop_token_ids=body.stop_token_ids, ignore_eos=body.ignore_eos, seed=body.seed,
                   logprob=logprob, skip_special_tokens=body.skip_special_tokens,
                   no_stop_trim=body.no_stop_trim)


def from_completion(body: CompletionBody) -> GenRequest:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise RequestError("a list of several prompts is not supported: send one request "
                               "per prompt", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, list) and not prompt:
        raise RequestError("prompt is empty", param="prompt")
    _unsupported("suffix", body.suffix, None)
    _unsupported("echo", body.echo, False)
    if body.best_of not in (None, 1):
        _unsupported("best_of", body.best_of, 1)
    max_tokens = _first(body.max_completion_tokens, body.max_tokens, 16)  # OpenAI's default
    params = _openai_common(body, max_tokens, body.logprobs is not None)
    text, ids = (prompt, None) if isinstance(prompt, str) else (None, tuple(prompt))
    return GenRequest(_rid(body.rid), text, ids, params, body.stream, _bootstrap(body))


def from_chat(body: ChatBody, prompt_text: str) -> GenRequest:
    """``prompt_text``: the messages rendered by the checkpoint's chat template."""
    if body.tools:
        raise RequestError("tools are not supported by glmlab", param="tools")
    if body.response_format and body.response_format.get("type", "text") != "text":
        raise RequestError("response_format other than text is not supported",
                           param="response_format")
    if body.top_logprobs:
        raise RequestError("top_logprobs is not supported", param="top_logprobs")
    # sglang-router rewrites max_tokens to max_completion_tokens (docs/platform.md 2.5)
    params = _openai_common(body, _first(body.max_completion_tokens, body.max_tokens, 128),
                            body.logprobs)
    return GenRequest(_rid(body.rid), prompt_text, None, params, body.stream, _bootstrap(body))
