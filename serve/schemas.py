"""Request bodies of the three generation APIs, validated strictly, reduced to one ``GenBatch``.

SGLang-native ``POST /generate``, OpenAI ``POST /v1/completions`` and ``POST /v1/chat/completions``.
Types are strict (a string is not a number, a float is not an int). Unknown top-level fields are
tolerated, because sglang-router adds its own (``log_metrics``, ``no_logs``...); unknown
*sampling* parameters are rejected (SGLang does the same), and the few known ones glmlab does not
implement (``suffix``, ``best_of`` other than n) are rejected with their name, never ignored.

A body is one prompt or a batch (a list of strings or of token-id lists), each sampled ``n``
times: a ``GenBatch`` of one ``GenRequest`` per prompt. The PD bootstrap fields come as SGLang's
workers take them (``bootstrap_host/port/room`` each a value or a list, one per prompt x sample;
a single room with several sub-requests means room + i, as ``io_struct`` normalises them).
Those records (``GenBatch``, ``GenRequest``, ``GrammarSpec``) and the field conversions the three
routes share are ``genbatch.py``'s; callers import them from here, next to the bodies.

Validation of values (temperature range, penalties...) is the engine's (``SamplingParams``, then
``Engine.add_request`` for the prompt), so HTTP and ``LLM`` accept and reject the same things.
This module knows request shapes only: no tokenizer, no engine, no HTTP.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from glmlab.core import SamplingParams
from glmlab.serve.errors import RequestError
from glmlab.serve.genbatch import (
    GenBatch,
    GenRequest,
    GrammarSpec,
    bootstraps,
    grammar_of,
    listify,
    params,
    reject_unsupported,
)

Ids = list[int]


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
    logit_bias: dict[str, float] | None = None


Many = str | list[str] | None


class GenerateBody(_Strict):
    text: str | list[str] | None = None
    input_ids: Ids | list[Ids] | None = None
    sampling_params: SglSamplingParams = Field(default_factory=SglSamplingParams)
    stream: bool = False
    rid: str | list[str] | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    model: str | None = None
    bootstrap_host: Many = None
    bootstrap_port: int | list[int] | None = None
    bootstrap_room: int | list[int] | None = None


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
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: dict[str, float] | None = None
    response_format: dict | None = None
    regex: str | None = None  # SGLang's extensions of the OpenAI bodies
    json_schema: str | None = None
    ebnf: str | None = None
    user: str | None = None
    rid: str | None = None
    bootstrap_host: Many = None
    bootstrap_port: int | list[int] | None = None
    bootstrap_room: int | list[int] | None = None


class CompletionBody(_OpenAIBody):
    prompt: str | list[str] | Ids | list[Ids]
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
    reasoning_content: str | None = None
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None
    name: str | None = None

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
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict | None = None
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    continue_final_message: bool = False


def _rid(rid: str | None) -> str:
    return rid or uuid.uuid4().hex


def _prompts(text, ids, name: str) -> tuple[list, bool]:
    """(prompts: str or tuple of ids each, batched)."""
    if (text is None) == (ids is None):
        raise RequestError("give exactly one of text or input_ids", param="text")
    if text is not None:
        return ([text], False) if isinstance(text, str) else (list(text), True)
    if ids and isinstance(ids[0], list):
        return [tuple(p) for p in ids], True
    return [tuple(ids)], False


def _batch(prompts: list, batched: bool, p: SamplingParams, body, stream: bool,
           grammar: GrammarSpec | None, rids: list[str] | None = None, **show) -> GenBatch:
    if not prompts:
        raise RequestError("the batch of prompts is empty", param="prompt")
    boots = bootstraps(body, len(prompts) * p.n)
    reqs = []
    for i, prompt in enumerate(prompts):
        rid = rids[i] if rids else _rid(None if batched else body.rid)
        mine = tuple(boots[i * p.n:(i + 1) * p.n])
        text, ids = (prompt, None) if isinstance(prompt, str) else (None, prompt)
        reqs.append(GenRequest(rid, text, ids, p, stream, mine[0], grammar, mine))
    return GenBatch(tuple(reqs), batched, stream, **show)


def from_generate(body: GenerateBody) -> GenBatch:
    prompts, batched = _prompts(body.text, body.input_ids, "text")
    sp = body.sampling_params
    reject_unsupported("custom_params", sp.custom_params, None)
    if body.top_logprobs_num < 0:
        raise RequestError("top_logprobs_num must be >= 0", param="top_logprobs_num")
    p = params(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k, min_p=sp.min_p,
               max_new_tokens=sp.max_new_tokens, min_new_tokens=sp.min_new_tokens, stop=sp.stop,
               stop_token_ids=sp.stop_token_ids, ignore_eos=sp.ignore_eos,
               seed=sp.sampling_seed if sp.sampling_seed is not None else sp.seed,
               logprobs=body.top_logprobs_num if body.return_logprob else None,
               skip_special_tokens=sp.skip_special_tokens, include_stop_str=sp.no_stop_trim,
               n=sp.n, frequency_penalty=sp.frequency_penalty,
               presence_penalty=sp.presence_penalty, repetition_penalty=sp.repetition_penalty,
               logit_bias=sp.logit_bias,
               prompt_logprobs_from=(body.logprob_start_len if body.return_logprob
                                     and body.logprob_start_len >= 0 else None))
    rids = None
    if isinstance(body.rid, list):
        rids = listify(body.rid, len(prompts), "rid")
    elif body.rid is not None and batched:
        rids = [f"{body.rid}-{i}" for i in range(len(prompts))]
    grammar = grammar_of(sp.regex, sp.json_schema, sp.ebnf, sp.structural_tag)
    return _batch(prompts, batched or p.n > 1, p, body, body.stream, grammar, rids,
                  top_logprobs=body.top_logprobs_num, logprob_texts=body.return_text_in_logprobs)


def _openai_params(body: _OpenAIBody, max_tokens: int, logprobs: int | None, **extra):
    return params(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                  min_p=body.min_p, max_new_tokens=max_tokens, min_new_tokens=body.min_tokens,
                  stop=body.stop, stop_token_ids=body.stop_token_ids, ignore_eos=body.ignore_eos,
                  seed=body.seed, logprobs=logprobs, skip_special_tokens=body.skip_special_tokens,
                  include_stop_str=body.no_stop_trim, n=body.n,
                  frequency_penalty=body.frequency_penalty,
                  presence_penalty=body.presence_penalty,
                  repetition_penalty=body.repetition_penalty, logit_bias=body.logit_bias, **extra)


def from_completion(body: CompletionBody) -> GenBatch:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompts, batched = [p if isinstance(p, str) else tuple(p) for p in prompt], True
    else:
        prompts, batched = [prompt if isinstance(prompt, str) else tuple(prompt)], False
    if any(len(p) == 0 for p in prompts if not isinstance(p, str)):
        raise RequestError("prompt is empty", param="prompt")
    reject_unsupported("suffix", body.suffix, None)
    if body.best_of not in (None, body.n):
        raise RequestError(f"best_of={body.best_of} is not supported (only best_of = n)",
                           param="best_of")
    max_tokens = _first(body.max_completion_tokens, body.max_tokens, 16)  # OpenAI's default
    lp = body.logprobs
    p = _openai_params(body, max_tokens, lp,
                       prompt_logprobs_from=0 if body.echo and lp is not None else None)
    grammar = grammar_of(body.regex, body.json_schema, body.ebnf,
                         response_format=body.response_format)
    return _batch(prompts, batched, p, body, body.stream, grammar, top_logprobs=lp or 0,
                  echo=body.echo)


def _first(*values):
    return next(v for v in values if v is not None)


def from_chat(body: ChatBody, prompt_text: str, grammar: GrammarSpec | None = None,
              extra: dict | None = None) -> GenBatch:
    """``prompt_text``: the messages rendered by the checkpoint's chat template; ``grammar``:
    what ``tool_choice`` requires (else the body's own constraint)."""
    if body.top_logprobs is not None and not body.logprobs:
        raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    # sglang-router rewrites max_tokens to max_completion_tokens (docs/platform.md 2.5)
    p = _openai_params(body, _first(body.max_completion_tokens, body.max_tokens, 128),
                       (body.top_logprobs or 0) if body.logprobs else None)
    own = grammar_of(body.regex, body.json_schema, body.ebnf,
                     response_format=body.response_format)
    if grammar is not None and own is not None:
        raise RequestError("tool_choice and response_format both constrain the output: "
                           "give one", param="response_format")
    return _batch([prompt_text], False, p, body, body.stream, grammar or own,
                  top_logprobs=body.top_logprobs or 0, extra=extra or {})
