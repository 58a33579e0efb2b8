"""A worker: one Engine on its own thread, serving requests in the mixed, prefill or decode role.

``MixedWorker`` runs whole requests. The PD roles (pd.py) add the transfer: the prefill worker
computes the prompt and pushes its cache rows, the decode worker admits the request with pages it
lacks and continues from the pushed state. All engine calls go through ``EngineAdapter``
(adapter.py), the narrow contract this package needs from ``glmlab.engine``; all engine and NIXL
calls run on the worker's engine thread (loop.py).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator

from glmlab.serve.adapter import EngineAdapter, StepEvent
from glmlab.serve.backend import Finish, ModelCard, Progress, ServeError
from glmlab.serve.config import Role, WorkerConfig
from glmlab.serve.loop import EngineThread, Outbox
from glmlab.serve.schemas import GenRequest
from glmlab.tokenizer import Tokenizer


class Timeline:
    """Recent per-request events (bootstrap, transfer, first token, finish) for /pd_trace."""

    def __init__(self, role: str, keep: int = 4096):
        self.role, self.events = role, collections.deque(maxlen=keep)

    def add(self, rid: str, what: str, **fields) -> None:
        self.events.append({"t": time.time(), "role": self.role, "rid": rid, "event": what,
                            **fields})


class Worker:
    """Shared machinery: the engine thread, request outboxes, stats; roles override ``generate``."""

    def __init__(self, wc: WorkerConfig, adapter: EngineAdapter):
        self.wc, self.eng = wc, adapter
        tok = Tokenizer.from_dir(wc.model_dir, adapter.eos_token_ids)
        self.card = ModelCard(wc.served_model_name, _path(wc.model_dir), adapter.context_len,
                              adapter.vocab_size, tok, wc.spec.role.value)
        self.timeline = Timeline(wc.spec.role.value)
        self.outboxes: dict[str, Outbox] = {}
        self.thread = EngineThread(self._work, self._busy)
        self.thread.start()

    # engine thread -----------------------------------------------------------------------
    def _busy(self) -> bool:
        return self.eng.has_work()

    def _work(self) -> bool:
        if not self.eng.has_work():
            return False
        for ev in self.eng.step():
            self._on_step_event(ev)
        return True

    def _on_step_event(self, ev: StepEvent) -> None:
        box = self.outboxes.get(ev.rid)
        if box is not None:
            box.push(Progress(tuple(ev.new_ids), ev.new_logprobs, ev.cached_tokens, ev.finish))
        if ev.finish is not None:
            self.timeline.add(ev.rid, "finish", reason=ev.finish.kind)

    # asyncio side ------------------------------------------------------------------------
    async def _register(self, rid: str) -> Outbox:
        box = Outbox(asyncio.get_running_loop())

        def claim():
            if rid in self.outboxes:
                raise ServeError(f"request id {rid!r} is already running", status=400)
            self.outboxes[rid] = box

        await self.thread.call(claim)
        return box

    def _forget(self, rid: str, abort: bool) -> None:
        def drop():
            self.outboxes.pop(rid, None)
            if abort:
                self.eng.abort(rid)

        self.thread.post(drop)

    async def _drain(self, rid: str, box: Outbox, meta: dict | None = None,
                     ) -> AsyncIterator[Progress]:
        """Events of ``rid`` until it finishes; an early exit aborts it."""
        done = False
        try:
            first = True
            while True:
                ev = await box.get()
                if isinstance(ev, BaseException):
                    raise ev
                if first and ev.new_ids:
                    self.timeline.add(rid, "first_token")
                    first = False
                if meta and ev.finish is not None:
                    ev = Progress(ev.new_ids, ev.new_logprobs, ev.cached_tokens, ev.finish,
                                  meta)
                yield ev
                if ev.finish is not None:
                    done = True
                    return
        finally:
            self._forget(rid, abort=not done)

    async def generate(self, req: GenRequest, ids: list[int]) -> AsyncIterator[Progress]:
        self._check_alive()
        box = await self._register(req.rid)
        self.timeline.add(req.rid, "admitted", prompt_len=len(ids))
        await self.thread.call(lambda: self.eng.submit(req.rid, ids, req.params,
                                                       req.return_logprob))
        async for ev in self._drain(req.rid, box):
            yield ev

    def _check_alive(self) -> None:
        if self.thread.failure:
            raise ServeError("the engine thread died: " + self.thread.failure.splitlines()[-1])

    async def flush_cache(self) -> tuple[bool, str]:
        ok = await self.thread.call(self.eng.flush_cache)
        return (True, "Cache flushed.\n") if ok else (
            False, "Cache not flushed: requests are running.\n")

    def stats(self) -> dict[str, float]:
        return {**self.eng.stats(), "num_pending_requests": len(self.outboxes)}

    def server_info(self) -> dict:
        return {"role": self.wc.spec.role.value, "disaggregation_mode": _mode(self.wc),
                "served_model_name": self.card.served_model_name,
                "model_path": str(self.card.model_dir), "tokenizer_path": str(self.card.model_dir),
                "context_len": self.card.context_len, "engine": self.eng.describe(),
                "internal_states": [self.stats()], "leak_check": self.eng.leak_check(),
                "version": "glmlab"}

    def trace(self) -> list[dict]:
        return list(self.timeline.events)

    async def close(self) -> None:
        self.thread.stop()
        self.thread.join(5)


class MixedWorker(Worker):
    pass


def _mode(wc: WorkerConfig) -> str:
    return "null" if wc.spec.role is Role.MIXED else wc.spec.role.value


def _path(p: str):
    from pathlib import Path

    return Path(p)


def build_backend(wc: WorkerConfig) -> Worker:
    adapter = EngineAdapter.load(wc)
    if wc.spec.role is Role.MIXED:
        return MixedWorker(wc, adapter)
    from glmlab.serve.decode import DecodeWorker
    from glmlab.serve.pd import PrefillWorker

    return (PrefillWorker if wc.spec.role is Role.PREFILL else DecodeWorker)(wc, adapter)


__all__ = ["Finish", "MixedWorker", "Worker", "build_backend"]
