"""The worker's engine thread: the one thread that touches the engine and the NIXL agent.

The HTTP side (asyncio) never calls the engine directly: it posts closures with ``call`` and
awaits their results, and it receives per-request records through ``Outbox`` queues. The thread
runs ``work()`` (one engine step plus transfer polling) while there is work, and otherwise sleeps
until a closure arrives or ``poll_s`` passes (transfers in flight are polled at that rate).
Keeping every engine and NIXL call on one thread makes both free of locks.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import traceback
from collections.abc import Callable
from typing import Any


class EngineThread(threading.Thread):
    def __init__(self, work: Callable[[], bool], busy: Callable[[], bool], poll_s: float = 0.002):
        """``work()`` does one round and returns whether it did anything; ``busy()`` says whether
        something (a running request, a transfer in flight) needs the next round soon."""
        super().__init__(name="glmlab-engine", daemon=True)
        self._work, self._busy, self._poll_s = work, busy, poll_s
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self.failure: str | None = None

    def call(self, fn: Callable[[], Any]) -> asyncio.Future:
        """Run ``fn`` on the engine thread; await the returned future from the event loop."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._calls.put((fn, loop, fut))
        return fut

    def post(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the engine thread, not waiting for it (cleanup from any thread)."""
        self._calls.put((fn, None, None))

    def stop(self) -> None:
        self._stop.set()
        self._calls.put((lambda: None, None, None))

    def run(self) -> None:
        try:
            while not self._stop.is_set():
                self._drain_calls(block=not self._busy())
                self._work()
        except BaseException:  # the engine itself broke: say so on every later call
            self.failure = traceback.format_exc()
            while True:
                fn, loop, fut = self._calls.get()
                if fut is not None:
                    loop.call_soon_threadsafe(_settle, fut, None,
                                              RuntimeError("the engine thread died:\n"
                                                           + self.failure))

    def _drain_calls(self, block: bool) -> None:
        try:
            item = self._calls.get(timeout=self._poll_s if not block else 0.05)
        except queue.Empty:
            return
        while True:
            fn, loop, fut = item
            try:
                result, error = fn(), None
            except Exception as e:  # returned to the awaiting request, not fatal for the engine
                result, error = None, e
            if fut is not None:
                loop.call_soon_threadsafe(_settle, fut, result, error)
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                return


def _settle(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.cancelled():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class Outbox:
    """Records of one request, pushed from the engine thread, read by its HTTP handler."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop, self._queue = loop, asyncio.Queue()

    def push(self, item: Any) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def get(self) -> Any:
        return await self._queue.get()
