"""Asyncio HTTP load generator for any SGLang-compatible server (glmlab serve, SGLang, its router).

Backends as in ``sglang.benchmark.serving``: ``sglang`` (POST /generate), ``sglang-oai``
(/v1/completions) and ``sglang-oai-chat`` (/v1/chat/completions), all streamed (SSE). Arrivals are
Poisson at ``request_rate`` (all at once when infinite), at most ``max_concurrency`` in flight.
Per request it records TTFT (first chunk that brings output), the gaps between chunks spread over
the tokens each chunk brings (ITL), end-to-end latency, and the server's token counts.
It knows HTTP and timing; datasets and statistics live in workloads.py and metrics.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import aiohttp

from glmlab.bench.workloads import BenchRequest

BACKENDS = ("sglang", "sglang-oai", "sglang-oai-chat")


@dataclass
class RequestResult:
    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_len: int = 0  # server-reported completion tokens
    cached_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    start: float = 0.0  # seconds since the run started
    chunk_times: list[float] = field(default_factory=list)  # run-relative time of each chunk


def _payload(backend: str, r: BenchRequest, model: str, temperature: float) -> tuple[str, dict]:
    if backend == "sglang":
        body = {"sampling_params": {"temperature": temperature, "max_new_tokens": r.output_len,
                                    "ignore_eos": True}, "stream": True}
        body.update({"text": r.text} if r.text is not None else {"input_ids": list(r.input_ids)})
        return "/generate", body
    common = {"model": model, "temperature": temperature, "max_tokens": r.output_len,
              "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if backend == "sglang-oai":
        prompt = r.text if r.text is not None else list(r.input_ids)
        return "/v1/completions", {**common, "prompt": prompt}
    if backend == "sglang-oai-chat":
        if r.text is None:
            raise ValueError("the chat backend needs text prompts (not --tokenize-prompt)")
        return "/v1/chat/completions", {**common,
                                        "messages": [{"role": "user", "content": r.text}]}
    raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def _chunk_tokens(backend: str, chunk: dict, seen: int) -> tuple[int, int]:
    """(completion tokens so far, cached tokens) from one streamed chunk."""
    if backend == "sglang":
        meta = chunk.get("meta_info", {})
        return int(meta.get("completion_tokens", seen)), int(meta.get("cached_tokens", 0))
    usage = chunk.get("usage") or {}
    if usage:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return int(usage.get("completion_tokens", seen)), int(cached)
    choices = chunk.get("choices") or [{}]
    c = choices[0]
    has_text = bool(c.get("text") or (c.get("delta") or {}).get("content"))
    return seen + (1 if has_text else 0), 0


async def send_one(session: aiohttp.ClientSession, base_url: str, backend: str,
                   r: BenchRequest, model: str, temperature: float, t0: float) -> RequestResult:
    path, body = _payload(backend, r, model, temperature)
    res = RequestResult(prompt_len=r.prompt_len, start=time.perf_counter() - t0)
    start = last = time.perf_counter()
    tokens = 0
    try:
        async with session.post(base_url + path, json=body) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return res
            async for raw in resp.content:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = str(chunk["error"])
                    return res
                now = time.perf_counter()
                new_tokens, cached = _chunk_tokens(backend, chunk, tokens)
                res.cached_tokens = max(res.cached_tokens, cached)
                if new_tokens > tokens:
                    if tokens == 0:
                        res.ttft = now - start
                    else:
                        res.itl.extend([(now - last) / (new_tokens - tokens)]
                                       * (new_tokens - tokens))
                    res.chunk_times.append(now - t0)
                    tokens, last = new_tokens, now
        res.latency = time.perf_counter() - start
        res.output_len = tokens
        res.success = tokens > 0
        if not res.success:
            res.error = "the server returned no output tokens"
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


async def run_load(base_url: str, backend: str, requests: list[BenchRequest], model: str,
                   temperature: float = 0.0, request_rate: float = float("inf"),
                   max_concurrency: int = 0, seed: int = 42,
                   timeout_s: float = 600.0) -> tuple[list[RequestResult], float]:
    """Send every request; returns (results in request order, wall seconds)."""
    rng = random.Random(seed)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency > 0 else None
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector,
                                     trust_env=False) as session:
        t0 = time.perf_counter()

        async def one(r: BenchRequest) -> RequestResult:
            if limit is None:
                return await send_one(session, base_url, backend, r, model, temperature, t0)
            async with limit:
                return await send_one(session, base_url, backend, r, model, temperature, t0)

        tasks = []
        for r in requests:
            tasks.append(asyncio.create_task(one(r)))
            if request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - t0


async def get_json(base_url: str, path: str, method: str = "GET") -> tuple[int, object]:
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(trust_env=False, timeout=timeout) as s, \
            s.request(method, base_url + path) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text
