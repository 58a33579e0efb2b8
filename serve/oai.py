"""Response shapes: SGLang's /generate (JSON and SSE) and OpenAI's completions and chat completions.

Pure formatting of ``Update``s (api.py) into the JSON each client library expects; SGLang stream
chunks carry the cumulative text and ids, OpenAI chunks carry deltas.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from glmlab.serve.schemas import GenRequest


def _meta(req: GenRequest, last, logprobs: list, out_ids: list) -> dict:
    meta = {"id": req.rid, "finish_reason": None, "prompt_tokens": last.prompt_tokens,
            "completion_tokens": last.completion_tokens, "cached_tokens": last.cached_tokens,
            **last.meta}
    if last.finish is not None:
        meta["finish_reason"] = last.finish.to_sglang(last.completion_tokens)
    if req.return_logprob:
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, out_ids,
                                                                       strict=False)]
    return meta


def sglang_response(req: GenRequest, last, text: str, out_ids: list, logprobs: list) -> dict:
    return {"text": text, "output_ids": out_ids, "meta_info": _meta(req, last, logprobs, out_ids)}


async def sglang_stream(api, req: GenRequest, ids: list[int]) -> AsyncIterator[dict]:
    text, out_ids, logprobs = "", [], []
    async for u in api.run(req, ids):
        text += u.delta
        out_ids.extend(u.new_ids)
        logprobs.extend(u.new_logprobs or ())
        if u.delta or u.finish is not None or u.new_ids:
            yield {"text": text, "output_ids": list(out_ids),
                   "meta_info": _meta(req, u, logprobs, out_ids)}


def _usage(last) -> dict:
    return {"prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
            "total_tokens": last.prompt_tokens + last.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": last.cached_tokens}}


def _cmpl_logprobs(tok, out_ids: list, logprobs: list) -> dict:
    tokens = [tok.decode([t], skip_special_tokens=False) for t in out_ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None,
            "text_offset": offsets}


def completion_response(req: GenRequest, model: str, tok, last, text: str, out_ids: list,
                        logprobs: list) -> dict:
    lps = _cmpl_logprobs(tok, out_ids, logprobs) if req.return_logprob else None
    return {"id": f"cmpl-{req.rid}", "object": "text_completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": lps,
                         "finish_reason": last.finish.openai if last.finish else None}],
            "usage": _usage(last)}


async def completion_stream(api, req: GenRequest, ids: list[int], model: str,
                            include_usage: bool) -> AsyncIterator[dict]:
    head = {"id": f"cmpl-{req.rid}", "object": "text_completion", "created": int(time.time()),
            "model": model}
    last = None
    async for u in api.run(req, ids):
        last = u
        if u.delta or u.finish is not None:
            yield {**head, "choices": [{"index": 0, "text": u.delta, "logprobs": None,
                                        "finish_reason": u.finish.openai if u.finish else None}]}
    if include_usage and last is not None:
        yield {**head, "choices": [], "usage": _usage(last)}


def chat_response(req: GenRequest, model: str, last, text: str, out_ids: list,
                  logprobs: list) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": text},
              "logprobs": None, "finish_reason": last.finish.openai if last.finish else None}
    if req.return_logprob:
        choice["logprobs"] = {"content": [{"token_id": t, "logprob": lp, "top_logprobs": []}
                                          for t, lp in zip(out_ids, logprobs, strict=False)]}
    return {"id": f"chatcmpl-{req.rid}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": _usage(last)}


async def chat_stream(api, req: GenRequest, ids: list[int], model: str,
                      include_usage: bool) -> AsyncIterator[dict]:
    head = {"id": f"chatcmpl-{req.rid}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}
    yield {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                "finish_reason": None}]}
    last = None
    async for u in api.run(req, ids):
        last = u
        if u.delta or u.finish is not None:
            delta = {"content": u.delta} if u.delta else {}
            yield {**head, "choices": [{"index": 0, "delta": delta,
                                        "finish_reason": u.finish.openai if u.finish else None}]}
    if include_usage and last is not None:
        yield {**head, "choices": [], "usage": _usage(last)}
