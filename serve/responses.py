"""Response shapes: SGLang's /generate, OpenAI's completions and chat completions, whole or SSE.

A request's engine records (``RequestOutput``, one per step) fold into one ``Result``: text, ids,
logprobs, cached tokens, the finish. A ``Renderer`` per API turns it into the JSON its clients
expect: ``whole`` for a plain answer; ``head``, ``chunk`` (after each record) and ``tail`` for a
stream. SGLang chunks carry the cumulative text and ids, OpenAI chunks carry deltas.

Pure formatting: no engine, no HTTP.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from glmlab.core import FinishReason, RequestOutput, TokenLogprob
from glmlab.serve.schemas import GenRequest


@dataclass
class Result:
    """Everything a request produced so far; ``delta`` / ``new_ids``: its last record's share."""

    rid: str
    prompt_tokens: int
    text: str = ""
    ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    cached_tokens: int = 0
    finish_reason: FinishReason | None = None
    matched_stop: int | str | None = None
    meta: dict = field(default_factory=dict)  # extra meta_info (e.g. the PD transfer record)
    delta: str = ""
    new_ids: tuple[int, ...] = ()

    def add(self, out: RequestOutput) -> None:
        self.delta, self.new_ids = out.text_delta, out.new_token_ids
        self.text += out.text_delta
        self.ids.extend(out.new_token_ids)
        self.logprobs.extend(out.logprobs or ())
        self.cached_tokens = out.cached_tokens
        self.finish_reason, self.matched_stop = out.finish_reason, out.matched_stop

    @property
    def completion_tokens(self) -> int:
        return len(self.ids)

    def sglang_finish(self) -> dict | None:
        reason = self.finish_reason
        if reason is None:
            return None
        if reason is FinishReason.STOP:
            return {"type": "stop", "matched": self.matched_stop}
        if reason is FinishReason.ABORT:
            return {"type": "abort", "message": "aborted"}
        # LENGTH, or PREFILLED: a prefill worker's answer to the router ends after one token
        return {"type": "length", "length": self.completion_tokens}

    def openai_finish(self) -> str | None:
        if self.finish_reason is None:
            return None
        return "stop" if self.finish_reason in (FinishReason.STOP, FinishReason.ABORT) else "length"

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


class Renderer:
    """One API's answers for one request. ``include_usage``: a final usage chunk in a stream."""

    def __init__(self, req: GenRequest, model: str, tokenizer, include_usage: bool = False):
        self.req, self.model, self.tokenizer = req, model, tokenizer
        self.include_usage = include_usage
        self.created = int(time.time())

    def whole(self, r: Result) -> dict:
        raise NotImplementedError

    def head(self) -> list[dict]:
        return []

    def chunk(self, r: Result) -> dict | None:
        raise NotImplementedError

    def tail(self, r: Result) -> list[dict]:
        return []


class SglangRenderer(Renderer):
    def _meta(self, r: Result) -> dict:
        meta = {"id": r.rid, "finish_reason": r.sglang_finish(), "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens, "cached_tokens": r.cached_tokens,
                **r.meta}
        if self.req.return_logprob:
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = [[lp.logprob, lp.token_id, None]
                                             for lp in r.logprobs]
        return meta

    def whole(self, r: Result) -> dict:
        return {"text": r.text, "output_ids": list(r.ids), "meta_info": self._meta(r)}

    def chunk(self, r: Result) -> dict | None:
        if r.delta or r.new_ids or r.finish_reason is not None:
            return self.whole(r)
        return None


class _OpenAIRenderer(Renderer):
    prefix, kind, chunk_kind = "", "", ""  # id prefix, object of an answer, of a stream chunk

    def _head(self, stream: bool = False) -> dict:
        return {"id": f"{self.prefix}-{self.req.rid}",
                "object": self.chunk_kind if stream else self.kind, "created": self.created,
                "model": self.model}

    def tail(self, r: Result) -> list[dict]:
        if not self.include_usage:
            return []
        return [{**self._head(stream=True), "choices": [], "usage": r.usage()}]


class CompletionRenderer(_OpenAIRenderer):
    prefix, kind, chunk_kind = "cmpl", "text_completion", "text_completion"

    def _logprobs(self, r: Result) -> dict | None:
        if not self.req.return_logprob:
            return None
        tokens = [self.tokenizer.decode([lp.token_id], skip_special_tokens=False)
                  for lp in r.logprobs]
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in r.logprobs],
                "top_logprobs": None, "text_offset": offsets}

    def whole(self, r: Result) -> dict:
        return {**self._head(), "choices": [{"index": 0, "text": r.text,
                                             "logprobs": self._logprobs(r),
                                             "finish_reason": r.openai_finish()}],
                "usage": r.usage()}

    def chunk(self, r: Result) -> dict | None:
        if not r.delta and r.finish_reason is None:
            return None
        return {**self._head(stream=True), "choices": [{
            "index": 0, "text": r.delta, "logprobs": None, "finish_reason": r.openai_finish()}]}


class ChatRenderer(_OpenAIRenderer):
    prefix, kind, chunk_kind = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def whole(self, r: Result) -> dict:
        choice = {"index": 0, "message": {"role": "assistant", "content": r.text},
                  "logprobs": None, "finish_reason": r.openai_finish()}
        if self.req.return_logprob:
            choice["logprobs"] = {"content": [
                {"token_id": lp.token_id, "logprob": lp.logprob, "top_logprobs": []}
                for lp in r.logprobs]}
        return {**self._head(), "choices": [choice], "usage": r.usage()}

    def head(self) -> list[dict]:
        return [{**self._head(stream=True), "choices": [{
            "index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]

    def chunk(self, r: Result) -> dict | None:
        if not r.delta and r.finish_reason is None:
            return None
        delta = {"content": r.delta} if r.delta else {}
        return {**self._head(stream=True), "choices": [{"index": 0, "delta": delta,
                                                        "finish_reason": r.openai_finish()}]}
