"""Response shapes: SGLang's /generate, OpenAI's completions and chat completions, whole or SSE.

A body's sub-requests (prompt x sample) each fold their engine records (``RequestOutput``, one
per step) into one ``Result``: text, ids, logprobs (and prompt logprobs), cached tokens, the
finish. A ``Renderer`` per API turns the results into the JSON its clients expect: ``whole``
for a plain answer (a list of SGLang objects for a batch or n > 1; OpenAI ``choices``, index =
prompt x n + sample); ``head``, ``chunk(result)`` after each record and ``tail`` for a stream.
SGLang chunks carry the cumulative text and ids, OpenAI chunks carry deltas. Chat answers pass
through the reasoning and tool-call parsers (serve/parsers) when the service has them.

Pure formatting: no engine, no HTTP.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from glmlab.core import FinishReason, RequestOutput, TokenLogprob
from glmlab.serve.schemas import GenBatch


@dataclass
class Result:
    """Everything a sub-request produced so far; ``delta`` / ``new_ids``: its last record's."""

    rid: str
    prompt_tokens: int
    index: int = 0  # the choice it is
    prompt_ids: tuple[int, ...] = ()
    text: str = ""
    ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    cached_tokens: int = 0
    finish_reason: FinishReason | None = None
    matched_stop: int | str | None = None
    meta: dict = field(default_factory=dict)  # extra meta_info (e.g. the PD transfer record)
    delta: str = ""
    new_ids: tuple[int, ...] = ()
    new_logprobs: tuple[TokenLogprob, ...] = ()
    view: dict = field(default_factory=dict)  # renderer state (parsers) of this choice

    def add(self, out: RequestOutput) -> None:
        self.delta, self.new_ids = out.text_delta, out.new_token_ids
        self.new_logprobs = tuple(out.logprobs or ())
        self.text += out.text_delta
        self.ids.extend(out.new_token_ids)
        self.logprobs.extend(self.new_logprobs)
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = list(out.prompt_logprobs)
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


def usage(results: list[Result], n: int) -> dict:
    """Prompt tokens once per prompt (its n samples share one prefill), outputs of all."""
    prompt = sum(r.prompt_tokens for r in results[::max(1, n)])
    done = sum(r.completion_tokens for r in results)
    cached = sum(r.cached_tokens for r in results[::max(1, n)])
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
            "prompt_tokens_details": {"cached_tokens": cached}}


class Renderer:
    """One API's answers for one body. ``include_usage``: a final usage chunk in a stream."""

    def __init__(self, batch: GenBatch, model: str, tokenizer, include_usage: bool = False,
                 parsers=None):
        self.batch, self.model, self.tokenizer = batch, model, tokenizer
        self.include_usage, self.parsers = include_usage, parsers
        self.created = int(time.time())
        self.req = batch.requests[0]

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def whole(self, results: list[Result]) -> dict | list:
        raise NotImplementedError

    def head(self) -> list[dict]:
        return []

    def chunk(self, r: Result) -> dict | None:
        raise NotImplementedError

    def tail(self, results: list[Result]) -> list[dict]:
        return []


class SglangRenderer(Renderer):
    def _lp(self, lp: TokenLogprob | None, token: int) -> list:
        text = self.token_text(token) if self.batch.logprob_texts else None
        return [None if lp is None else lp.logprob, token, text]

    def _top(self, lp: TokenLogprob | None) -> list | None:
        if lp is None:
            return None
        return [self._lp(TokenLogprob(t, v), t) for t, v in lp.top[:self.batch.top_logprobs]]

    def _meta(self, r: Result) -> dict:
        meta = {"id": r.rid, "finish_reason": r.sglang_finish(), "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens, "cached_tokens": r.cached_tokens,
                **r.meta}
        if self.req.return_logprob:
            start = self.req.params.prompt_logprobs_from
            prompt = list(r.prompt_ids[start:]) if start is not None else []
            pl = r.prompt_logprobs
            meta["input_token_logprobs"] = [self._lp(lp, t) for lp, t in zip(pl, prompt,
                                                                             strict=False)]
            meta["output_token_logprobs"] = [self._lp(lp, lp.token_id) for lp in r.logprobs]
            if self.batch.top_logprobs:
                meta["input_top_logprobs"] = [self._top(lp) for lp in pl]
                meta["output_top_logprobs"] = [self._top(lp) for lp in r.logprobs]
        return meta

    def _one(self, r: Result) -> dict:
        out = {"text": r.text, "output_ids": list(r.ids), "meta_info": self._meta(r)}
        if self.batch.batched and self.batch.stream:
            out["index"] = r.index
        return out

    def whole(self, results: list[Result]) -> dict | list:
        answers = [self._one(r) for r in results]
        return answers if self.batch.batched else answers[0]

    def chunk(self, r: Result) -> dict | None:
        if r.delta or r.new_ids or r.finish_reason is not None:
            return self._one(r)
        return None


class _OpenAIRenderer(Renderer):
    prefix, kind, chunk_kind = "", "", ""  # id prefix, object of an answer, of a stream chunk

    def _head(self, stream: bool = False) -> dict:
        return {"id": f"{self.prefix}-{self.req.rid}",
                "object": self.chunk_kind if stream else self.kind, "created": self.created,
                "model": self.model}

    def tail(self, results: list[Result]) -> list[dict]:
        if not self.include_usage:
            return []
        return [{**self._head(stream=True), "choices": [], "usage": usage(results,
                                                                           self.batch.n)}]


class CompletionRenderer(_OpenAIRenderer):
    prefix, kind, chunk_kind = "cmpl", "text_completion", "text_completion"

    def _logprobs(self, lps: list[TokenLogprob | None], tokens: list[int], at: int) -> dict:
        texts = [self.token_text(t) for t in tokens]
        offsets = []
        for t in texts:
            offsets.append(at)
            at += len(t)
        k = self.batch.top_logprobs
        return {"tokens": texts, "token_logprobs": [None if lp is None else lp.logprob
                                                    for lp in lps],
                "top_logprobs": [None if lp is None else
                                 {self.token_text(t): v for t, v in lp.top[:k]} for lp in lps],
                "text_offset": offsets}

    def _prompt_text(self, r: Result) -> str:
        return self.tokenizer.decode(list(r.prompt_ids)) if self.batch.echo else ""

    def _choice_logprobs(self, r: Result) -> dict | None:
        if not self.req.return_logprob:
            return None
        out = self._logprobs(r.logprobs, [lp.token_id for lp in r.logprobs],
                             len(self._prompt_text(r)))
        if self.batch.echo and r.prompt_logprobs:
            head = self._logprobs(r.prompt_logprobs, list(r.prompt_ids), 0)
            out = {k: head[k] + out[k] for k in out}
        return out

    def whole(self, results: list[Result]) -> dict:
        return {**self._head(), "choices": [
            {"index": r.index, "text": self._prompt_text(r) + r.text,
             "logprobs": self._choice_logprobs(r), "finish_reason": r.openai_finish()}
            for r in results], "usage": usage(results, self.batch.n)}

    def chunk(self, r: Result) -> dict | None:
        first = r.completion_tokens == len(r.new_ids) and r.new_ids
        text = (self._prompt_text(r) if first else "") + r.delta
        if not text and r.finish_reason is None:
            return None
        lps = None
        if self.req.return_logprob:
            lps = self._logprobs(list(r.new_logprobs), [lp.token_id for lp in r.new_logprobs],
                                 0)
        return {**self._head(stream=True), "choices": [{
            "index": r.index, "text": text, "logprobs": lps,
            "finish_reason": r.openai_finish()}]}


class ChatRenderer(_OpenAIRenderer):
    prefix, kind, chunk_kind = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def _content_logprobs(self, lps) -> list[dict]:
        def one(t: int, v: float) -> dict:
            text = self.token_text(t)
            return {"token": text, "logprob": v, "bytes": list(text.encode())}

        k = self.batch.top_logprobs
        return [{**one(lp.token_id, lp.logprob), "top_logprobs": [one(t, v)
                                                                  for t, v in lp.top[:k]]}
                for lp in lps]

    def _finish(self, r: Result, calls: bool) -> str | None:
        reason = r.openai_finish()
        return "tool_calls" if reason == "stop" and calls else reason

    def whole(self, results: list[Result]) -> dict:
        choices = []
        for r in results:
            message = {"role": "assistant", "content": r.text}
            calls = []
            if self.parsers is not None:
                message, calls = self.parsers.whole(r.text)
            choice = {"index": r.index, "message": message, "logprobs": None,
                      "finish_reason": self._finish(r, bool(calls))}
            if self.req.return_logprob:
                choice["logprobs"] = {"content": self._content_logprobs(r.logprobs)}
            choices.append(choice)
        return {**self._head(), "choices": choices, "usage": usage(results, self.batch.n)}

    def head(self) -> list[dict]:
        return [{**self._head(stream=True), "choices": [{
            "index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
            for i in range(self.batch.n)]

    def chunk(self, r: Result) -> dict | None:
        if not r.delta and r.finish_reason is None:
            return None
        delta = {"content": r.delta} if r.delta else {}
        calls = False
        if self.parsers is not None:
            stream = r.view.setdefault("parser", self.parsers.stream())
            delta = stream.feed(r.delta, final=r.finish_reason is not None)
            calls = stream.saw_calls
            if not delta and r.finish_reason is None:
                return None
        choice = {"index": r.index, "delta": delta, "finish_reason": self._finish(r, calls)}
        if self.req.return_logprob and r.new_logprobs:
            choice["logprobs"] = {"content": self._content_logprobs(r.new_logprobs)}
        return {**self._head(stream=True), "choices": [choice]}
