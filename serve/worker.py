"""A worker: an Engine on its own thread, serving requests in the mixed, prefill or decode role.

``Worker`` (the mixed role) runs whole requests: ``open`` queues one in the engine (which
validates it: ``InvalidRequest`` comes back before anything is sent) and returns the stream of
the engine's records for it. The PD roles (prefill.py, decode.py) add the transfer: the prefill
worker computes the prompt and pushes its cache rows, the decode worker admits the request with
pages it lacks and continues from the pushed state. Every engine and NIXL call runs on the
worker's engine thread (engine_thread.py); the HTTP side only awaits results.

A worker of ``tp`` ranks is this process (rank 0, the ``LeaderEngine``) and its followers
(ranks.py): the thread steps the leader, which steps every rank; when the engine is idle it still
syncs the followers while their rank-local work (transfers) is pending, and now and then to keep
them alive. With speculation on, the stats carry the acceptance length per cycle
(``spec_accept_length``: tokens committed per request per verify, SGLang's gauge).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from glmlab.core import FinishReason, RequestOutput, sample_rid
from glmlab.engine.engine import Engine
from glmlab.serve.config import Role, WorkerConfig, engine_config
from glmlab.serve.engine_thread import EngineThread, Outbox
from glmlab.serve.errors import ServeError
from glmlab.serve.schemas import GenRequest
from glmlab.serve.timeline import Timeline
from glmlab.tokenizer import Tokenizer


@dataclass(frozen=True)
class ModelCard:
    """What the HTTP layer shows of the model a worker serves."""

    served_model_name: str
    model_dir: Path
    context_len: int  # prompt + output tokens one request may reach
    tokenizer: Tokenizer
    role: str
    model_type: str = "glm5_next"
    architectures: tuple[str, ...] = ("Glm5NextForConditionalGeneration",)

    def accepts(self, name: str | None) -> bool:
        return name in (None, "", self.served_model_name, str(self.model_dir), "default")


class Records:
    """The engine's records of one request. Closing it before the end, even before the first
    record was read (a client gone at once), aborts the request and frees what it holds."""

    def __init__(self, gen: AsyncIterator[RequestOutput], abort: Callable[[], None]):
        self._gen, self._abort, self._started = gen, abort, False

    def __aiter__(self) -> Records:
        return self

    async def __anext__(self) -> RequestOutput:
        self._started = True
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        if not self._started:
            self._started = True
            self._abort()
        await self._gen.aclose()


TICK_S = 0.005  # an idle TP leader polls its followers' transfers this often
SPEC_HISTORY = 1024  # cycles of speculative stats a long-running worker keeps


class Worker:
    """The engine thread, one outbox per request, stats; the PD roles override ``open``."""

    def __init__(self, wc: WorkerConfig, engine: Engine, followers=None):
        if engine.tokenizer is None:
            raise ServeError(f"{wc.model_dir} has no tokenizer.json: the service needs one")
        self.wc, self.engine, self.followers = wc, engine, followers
        self._last_sync = time.monotonic()
        self._rank_states: list[dict] = []
        self.card = ModelCard(wc.served_model_name, Path(wc.model_dir), engine.context_len,
                              engine.tokenizer, wc.spec.role.value)
        self.timeline = Timeline(wc.spec.role.value)
        self.outboxes: dict[str, Outbox] = {}
        self.thread = EngineThread(self._work, self._busy)
        self.thread.start()

    # engine thread -----------------------------------------------------------------------
    def _busy(self) -> bool:
        return self.engine.has_work

    def _work(self) -> bool:
        stepped = self.engine.has_work
        if stepped:
            for out in self.engine.step():
                self._on_output(out)
            spec = self.engine.spec
            if spec is not None and len(spec.stats) > 2 * SPEC_HISTORY:
                spec.trim(SPEC_HISTORY)
        if self.followers is not None:
            self._sync_followers(stepped)
        return stepped

    def _sync_followers(self, stepped: bool) -> None:
        from glmlab.serve.ranks import KEEPALIVE_S

        now = time.monotonic()
        idle_for = now - self._last_sync
        reports = []
        if stepped:
            self._last_sync = now
        elif (self.engine.pending or (self._rank_work() and idle_for > TICK_S)
              or idle_for > KEEPALIVE_S):
            reports = self.engine.sync()
            self._last_sync = now
        reports += self.engine.take_reports()
        if reports:
            self._on_reports(reports)

    def _rank_work(self) -> bool:
        """Whether the followers have rank-local work in flight (the PD roles' transfers)."""
        return False

    def _on_reports(self, reports: list) -> None:
        """The followers' (rank, report) items since the last call (PD roles read them)."""

    def _on_output(self, out: RequestOutput) -> None:
        box = self.outboxes.get(out.rid)
        if box is not None:
            box.push(out)
        if out.finished:
            self.timeline.add(out.rid, "finish", reason=out.finish_reason.value)
            if out.finish_reason is not FinishReason.PREFILLED:
                self.engine.forget(out.rid)

    def _drop(self, rid: str) -> None:
        """End ``rid`` in the engine (if it is still there) and forget its record."""
        self.engine.abort(rid)
        with contextlib.suppress(KeyError):  # never queued here, or already forgotten
            self.engine.forget(rid)

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
                self._drop(rid)

        self.thread.post(drop)

    def _records(self, rid: str, box: Outbox, meta: dict,
                 before: Callable[[], Awaitable[None]] | None = None) -> Records:
        return Records(self._drain(rid, box, meta, before), lambda: self._forget(rid, True))

    async def _drain(self, rid: str, box: Outbox, meta: dict,
                     before: Callable[[], Awaitable[None]] | None) -> AsyncIterator[RequestOutput]:
        """The records of ``rid`` until it finishes (dicts pushed to its box update ``meta``),
        after ``before()`` (decode: the room message); an early exit aborts it."""
        done, first = False, True
        try:
            if before is not None:
                await before()
            while True:
                item = await box.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, dict):
                    meta.update(item)
                    continue
                if first and item.new_token_ids:
                    self.timeline.add(rid, "first_token")
                    first = False
                yield item
                if item.finished:
                    done = True
                    return
        finally:
            self._forget(rid, abort=not done)

    def one_prefill(self, req: GenRequest) -> bool:
        """Whether the ``params.n`` samples of ``req`` are ONE engine request here (one prefill,
        the samples forked: ``open_samples``) rather than n requests of one sample each. A
        grammar matcher follows one sample only."""
        return req.grammar is None

    async def open(self, req: GenRequest, ids: list[int], meta: dict) -> Records:
        """Queue ``req`` (one sample); raises the engine's ``InvalidRequest`` (or a ServeError)
        at once, else returns the stream of its records. ``meta`` receives extra meta_info (PD
        transfers)."""
        return (await self.open_samples(req, ids, [meta]))[0]

    async def open_samples(self, req: GenRequest, ids: list[int],
                           metas: list[dict]) -> list[Records]:
        """The records of the ``params.n`` samples of ONE engine request (one prefill, forked:
        ``glmlab.engine.parallel``), registered before the request is queued."""
        self._check_alive()
        rids = [sample_rid(req.rid, i) for i in range(req.params.n)]
        boxes = await self._register_all(rids)
        self.timeline.add(req.rid, "admitted", prompt_len=len(ids), samples=len(rids))
        try:
            await self.thread.call(lambda: self.engine.add_request(ids, req.params, rid=req.rid,
                                                                   grammar=req.matcher()))
        except BaseException:
            for rid in rids:
                self._forget(rid, abort=False)
            raise
        return [self._records(rid, box, meta) for rid, box, meta in zip(rids, boxes, metas,
                                                                        strict=True)]

    async def _register_all(self, rids: list[str]) -> list[Outbox]:
        boxes: list[Outbox] = []
        try:
            for rid in rids:
                boxes.append(await self._register(rid))
        except BaseException:
            for rid in rids[:len(boxes)]:
                self._forget(rid, abort=False)
            raise
        return boxes

    def _check_alive(self) -> None:
        if self.thread.failure:
            raise ServeError("the engine thread died: " + self.thread.failure.splitlines()[-1])

    async def flush_cache(self) -> bool:
        return await self.thread.call(self.engine.flush_cache)

    def stats(self) -> dict[str, float]:
        """Gauges, under SGLang's names where it has one (read at scrape time)."""
        s = self.engine.stats()
        spec = self.engine.spec
        if spec is not None and self.wc.spec.role is not Role.PREFILL:  # prefill only learns
            # mean tokens committed per request per cycle, since start
            t = spec.totals
            extra = {"spec_accept_length": spec.accept_length, "spec_cycles": t["cycles"],
                     "spec_verified_requests": t["verified"]}
        else:
            extra = {}
        return {**extra, "num_running_reqs": s.running, "num_queue_reqs": s.waiting,
                "num_parked_reqs": s.parked, "num_pending_requests": len(self.outboxes),
                "token_usage": s.pages_used / max(1, s.pages_total),
                "pages_used": s.pages_used, "pages_total": s.pages_total,
                "pages_tree": s.pages_tree, "pages_evictable": s.pages_evictable,
                "state_slots_used": s.state_slots_used, "state_slots_total": s.state_slots_total,
                "state_checkpoints": s.state_checkpoints, "cache_hit_rate": s.hit_rate,
                "cached_tokens_total": s.cached_tokens,
                "prefill_compute_tokens": s.prefill_compute_tokens,
                "prefill_cache_tokens": s.cached_tokens, "decode_tokens": s.decode_tokens,
                "pages_allocated": s.pages_allocated}

    def _leak_check(self) -> str:
        """"ok" when nothing holds a lease and every pool is free or evictable cache, on
        every rank of the worker."""
        if not self.engine.is_idle:
            return "busy"
        problems = self.engine.leaks() + self._rank_leaks()
        return "ok" if not problems else "leak: " + "; ".join(problems)

    def _rank_leaks(self) -> list[str]:
        if self.followers is None:
            return []
        from glmlab.serve.ranks import reports_of

        self.engine.post(("leaks",))
        reports = self.engine.sync()
        self._last_sync = time.monotonic()
        self._on_reports(reports)
        ranks = reports_of(reports, "leaks")
        self._rank_states = [{"rank": rank, "leaks": problems, **stats}
                             for rank, (_, problems, stats) in ranks]
        return [f"rank {rank}: {p}" for rank, (_, problems, _) in ranks for p in problems]

    def _info(self) -> dict:
        e, wc = self.engine, self.wc
        leak_check = self._leak_check()  # first: it refreshes the followers' states
        return {"role": wc.spec.role.value,
                "disaggregation_mode": "null" if wc.spec.role is Role.MIXED else wc.spec.role.value,
                "served_model_name": self.card.served_model_name,
                "model_path": str(self.card.model_dir), "tokenizer_path": str(self.card.model_dir),
                "context_len": e.context_len, "tp_size": wc.spec.tp, "ep_size": wc.spec.ep,
                # every knob as served, the bound backends, the pools; then what the weights are.
                # Not "model": sglang-router takes that key for the model's id in /v1/models.
                "engine": e.describe(), "weights": weight_info(e.model),
                "internal_states": [self._internal_state()], "leak_check": leak_check,
                "ranks": self._rank_states,  # followers: their leak check and pool use
                "version": "glmlab"}

    def _internal_state(self) -> dict:
        state = self.stats()
        if "spec_accept_length" in state:  # the key SGLang's /server_info uses
            state["avg_spec_accept_length"] = state["spec_accept_length"]
        return state

    async def server_info(self) -> dict:
        # on the engine thread: the leak check walks the pools, which only that thread mutates
        return await self.thread.call(self._info)

    async def close(self) -> None:
        self.thread.stop()
        self.thread.join(5)
        if self.followers is not None:  # the engine thread is gone: release the followers
            self.followers.close(self.engine)


def weight_info(model) -> dict:
    """What the loaded weights are, counted on the model itself: how many tensors (and bytes)
    stayed block-FP8 for the kernels, and the bytes of all of them."""
    tensors = list(itertools.chain(model.parameters(), model.buffers()))
    fp8 = [t for t in tensors if t.dtype == torch.float8_e4m3fn]
    return {"fp8_tensors": len(fp8), "fp8_bytes": sum(t.numel() for t in fp8),
            "bytes": sum(t.numel() * t.element_size() for t in tensors)}


def load_worker(wc: WorkerConfig) -> Worker:
    """The role's worker around an engine loaded from ``wc`` (``Engine.from_pretrained``; with
    ``tp > 1`` rank 0's shard, the followers started beside it)."""
    followers = None
    if wc.spec.tp > 1:
        from glmlab.serve.ranks import start_leader

        engine, followers = start_leader(wc)
    else:
        engine = Engine.from_pretrained(wc.model_dir,
                                        engine_config(wc.spec.role, wc.engine, wc.spec.device))
    if wc.spec.role is Role.MIXED:
        return Worker(wc, engine, followers)
    from glmlab.serve.decode import DecodeWorker
    from glmlab.serve.prefill import PrefillWorker

    return (PrefillWorker if wc.spec.role is Role.PREFILL else DecodeWorker)(wc, engine,
                                                                             followers)
