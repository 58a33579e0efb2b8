"""What every generation body reduces to, and the conversions the three routes share.

A body (``schemas.GenerateBody``, ``CompletionBody``, ``ChatBody``) becomes one ``GenBatch``: one
``GenRequest`` per prompt, each carrying the engine's ``SamplingParams`` (which say ``n``,
logprobs and which text), an optional ``GrammarSpec`` and, in PD, one ``Bootstrap`` per sample.
The helpers here turn body fields into those: ``params`` (stop strings, logit bias, and the
engine's ``InvalidRequest`` as a ``RequestError``), ``grammar_of`` (at most one output
constraint) and ``bootstraps`` (SGLang's bootstrap fields, normalised as its workers do).

Callers import these names from ``glmlab.serve.schemas``, which re-exports the records; this
module knows no pydantic body, no tokenizer, no engine and no HTTP.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from glmlab.core import InvalidRequest, SamplingParams
from glmlab.serve.errors import RequestError


@dataclass(frozen=True)
class Bootstrap:
    host: str
    port: int
    room: int


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint on the output: compiled once per (kind, source) by ``glmlab.grammar``."""

    kind: Literal["json_object", "json_schema", "regex", "ebnf", "structural_tag"]
    source: str = ""


@dataclass(frozen=True)
class GenRequest:
    """One prompt (text or ids) and how to continue it: the engine's ``SamplingParams`` (which
    say ``n``, logprobs and which text), a grammar, and one bootstrap per sample in PD."""

    rid: str
    text: str | None
    input_ids: tuple[int, ...] | None
    params: SamplingParams
    stream: bool
    bootstrap: Bootstrap | None
    grammar: GrammarSpec | None = None
    bootstraps: tuple[Bootstrap | None, ...] = ()  # per sample (n > 1), else (bootstrap,)
    compiled: object | None = field(default=None, compare=False)  # serve/grammar.py

    def matcher(self):
        """A fresh grammar matcher for the engine (None without a constraint)."""
        return None if self.compiled is None else self.compiled.matcher()

    @property
    def return_logprob(self) -> bool:
        return self.params.logprobs is not None


@dataclass(frozen=True)
class GenBatch:
    """Everything one body asks: its prompts (each ``params.n`` samples) and how to show them."""

    requests: tuple[GenRequest, ...]
    batched: bool  # the body gave a list of prompts (or n > 1 on /generate): answer a list
    stream: bool
    top_logprobs: int = 0  # alternatives shown per token
    echo: bool = False  # completions: the prompt is part of the text (and of the logprobs)
    logprob_texts: bool = False  # /generate return_text_in_logprobs
    extra: dict = field(default_factory=dict)  # route-specific (chat: tools, reasoning)

    @property
    def n(self) -> int:
        return self.requests[0].params.n


def reject_unsupported(name: str, value, default) -> None:
    """A known field glmlab does not implement: refused with its name unless left at ``default``."""
    if value != default and value is not None:
        raise RequestError(f"{name}={value!r} is not supported by glmlab (only {default!r})",
                           param=name)


def listify(value, num: int, name: str, step: bool = False) -> list:
    """A field given once (``step``: room + i) or per sub-request -> one value per sub-request."""
    if not isinstance(value, list):
        return [value + i if step else value for i in range(num)]
    if len(value) != num:
        raise RequestError(f"{name} lists {len(value)} values for {num} sub-requests",
                           param=name)
    return list(value)


def bootstraps(body, num: int) -> list[Bootstrap | None]:
    """One bootstrap per sub-request (prompt-major, then sample), normalised as SGLang's
    workers do; all None outside PD."""
    host, port, room = body.bootstrap_host, body.bootstrap_port, body.bootstrap_room
    if host is None and port is None and room is None:
        return [None] * num
    if host is None or room is None:
        raise RequestError("bootstrap_host and bootstrap_room must come together",
                           param="bootstrap_room")
    if port is None:
        raise RequestError("bootstrap_port is null: start the router with the prefill's "
                           "bootstrap port (--prefill URL PORT)", param="bootstrap_port")
    rooms = listify(room, num, "bootstrap_room", step=True)
    if any(r < 0 for r in rooms):
        raise RequestError("bootstrap_room must be >= 0", param="bootstrap_room")
    return [Bootstrap(h, p, r) for h, p, r in zip(listify(host, num, "bootstrap_host"),
                                                  listify(port, num, "bootstrap_port"), rooms,
                                                  strict=True)]


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    return (stop,) if isinstance(stop, str) else tuple(stop or ())


def _bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    out = []
    for key, value in (bias or {}).items():
        try:
            out.append((int(key), float(value)))
        except ValueError:
            raise RequestError(f"logit_bias keys must be token ids, got {key!r}",
                               param="logit_bias") from None
    return tuple(out)


def params(**kw) -> SamplingParams:
    kw["stop"] = _stops(kw.get("stop"))
    kw["stop_token_ids"] = tuple(kw.get("stop_token_ids") or ())
    kw["logit_bias"] = _bias(kw.get("logit_bias"))
    try:
        return SamplingParams(**kw)
    except InvalidRequest as e:
        raise RequestError(str(e), param=e.field) from e


def grammar_of(regex=None, json_schema=None, ebnf=None, structural_tag=None,
               response_format: dict | None = None) -> GrammarSpec | None:
    given = [(k, v) for k, v in (("regex", regex), ("json_schema", json_schema), ("ebnf", ebnf),
                                 ("structural_tag", structural_tag)) if v is not None]
    fmt = (response_format or {}).get("type", "text")
    if fmt == "json_object":
        given.append(("json_object", ""))
    elif fmt == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema", spec.get("schema_"))
        if not isinstance(schema, dict):
            raise RequestError("response_format json_schema needs json_schema.schema (an "
                               "object)", param="response_format")
        given.append(("json_schema", json.dumps(schema)))
    elif fmt not in ("text", None):
        raise RequestError(f"response_format type {fmt!r}: choose text, json_object or "
                           "json_schema", param="response_format")
    if len(given) > 1:
        raise RequestError(f"at most one constraint per request, got {[k for k, _ in given]}",
                           param=given[1][0])
    return GrammarSpec(*given[0]) if given else None
