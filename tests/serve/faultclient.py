"""A client for the fault, disconnect and soak tests: it records what each request *saw* (status,
the error message of an HTTP error body or of an SSE error event, when it ended), can walk away
from a request at a chosen point, and checks through ``GET /server_info`` that the service's pools
are back to empty. Requests run on aiohttp in a thread of their own, so a test can kill processes
while they are in flight."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

import aiohttp

from tests.serve.conftest import http


@dataclass
class Seen:
    status: int | None = None
    events: int = 0  # SSE data events before [DONE] (a stream), or 1 (a whole answer)
    error: str | None = None  # message of the error body or SSE error event; None: no error
    transport: str | None = None  # the connection failed without an HTTP answer
    done: bool = False  # a whole answer, or a stream that reached [DONE]
    left: bool = False  # the client walked away (as asked)
    ended_at: float = 0.0  # time.monotonic() when it ended
    body: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.error is not None or self.transport is not None


@dataclass(frozen=True)
class Ask:
    """One request: ``leave_after`` SSE events (a stream) or seconds (whole answer), or never."""

    path: str
    body: dict
    leave_after: float | None = None


async def one(session: aiohttp.ClientSession, url: str, ask: Ask) -> Seen:
    seen = Seen()
    try:
        if ask.leave_after is not None and not ask.body.get("stream"):
            try:
                return await asyncio.wait_for(_exchange(session, url, ask, seen), ask.leave_after)
            except asyncio.TimeoutError:
                seen.left = True
                return seen
        return await _exchange(session, url, ask, seen)
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
        seen.transport = f"{type(e).__name__}: {e}"
        return seen
    finally:
        seen.ended_at = time.monotonic()


async def _exchange(session: aiohttp.ClientSession, url: str, ask: Ask, seen: Seen) -> Seen:
    async with session.post(url + ask.path, json=ask.body) as resp:
        seen.status = resp.status
        if resp.content_type != "text/event-stream":
            text = await resp.text()
            try:
                seen.body = json.loads(text)
            except ValueError:
                seen.body = {"text": text}
            if resp.status >= 400:
                seen.error = str((seen.body.get("error") or {}).get("message", text))
            else:
                seen.events, seen.done = 1, True
            return seen
        async for raw in resp.content:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                seen.done = True
                break
            event = json.loads(data)
            if "error" in event:
                seen.error = str(event["error"].get("message"))
                continue
            seen.events += 1
            seen.body = event
            if ask.leave_after is not None and seen.events >= ask.leave_after:
                seen.left = True
                break  # leaving the context closes the connection mid-stream
    return seen


async def run_all(url: str, asks: list[Ask], concurrency: int = 0,
                  timeout_s: float = 120.0) -> list[Seen]:
    limit = asyncio.Semaphore(concurrency) if concurrency else None
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, trust_env=False,
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async def go(ask: Ask) -> Seen:
            if limit is None:
                return await one(session, url, ask)
            async with limit:
                return await one(session, url, ask)

        return list(await asyncio.gather(*(go(a) for a in asks)))


class InFlight:
    """``asks`` sent at once from a thread; ``join`` returns what each saw."""

    def __init__(self, url: str, asks: list[Ask], concurrency: int = 0, timeout_s: float = 120.0):
        self._out: list[Seen] = []
        self._thread = threading.Thread(target=lambda: self._out.extend(
            asyncio.run(run_all(url, asks, concurrency, timeout_s))), daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> list[Seen]:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"requests still open after {timeout_s} s (a hang)"
        return self._out


def gen(ids: list[int], n: int, stream: bool = False, **extra) -> dict:
    return {"input_ids": ids, "stream": stream, **extra,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}


def worker_rows(url: str) -> list[dict]:
    status, info = http(url + "/server_info", timeout=10)
    assert status == 200, info
    return info["workers"]


BUSY_KEYS = ("running", "waiting", "parked", "used_pages", "used_state_slots",
             "pending_transfers", "open_requests")


def wait_quiet(url: str, timeout_s: float = 20.0) -> list[dict]:
    """The rows of ``/server_info`` once every worker holds nothing (asserted within
    ``timeout_s``: aborts reach the engines asynchronously, but soon)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = worker_rows(url)
        quiet = all("error" not in r and not any(r[k] for k in BUSY_KEYS) for r in rows)
        if quiet or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for r in rows:
        assert "error" not in r, r
        assert {k: r[k] for k in BUSY_KEYS} == dict.fromkeys(BUSY_KEYS, 0), r
        assert r["cached_pages"] == r["evictable_pages"], r  # the tree holds only free pages
        assert r["leak_check"] == "ok", r
    return rows
