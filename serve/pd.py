"""The two disaggregated roles: a prefill worker that pushes, a decode worker that receives.

Per request (same ``bootstrap_room`` on both sides, from the router):

decode  reserve pages + a state slot after a kv_only radix match -> POST /rooms/{room} to the
        prefill's listener (its pages for the uncached part of the prompt) -> wait for the NIXL
        notification -> read the aux row (first token) -> the engine continues decoding.
prefill wait for the room message -> prefill the prompt (the engine keeps the request's pages and
        state after it finishes) -> one NIXL WRITE of the missing pages, the state rows and the aux
        row, notifying ``glmlab:{room}:ok:{bytes}`` -> free the pages -> answer the router.

Failures are reported to both sides and always free what the request held: a prefill error sends
``glmlab:{room}:fail:{reason}``; decode gives up after ``transfer_timeout_s`` or as soon as the
prefill's listener stops answering, telling the prefill with ``DELETE /rooms/{room}``. Pages that
a live prefill may still be writing into (the WRITE was already posted) are not reused until its
notification arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from glmlab.serve.adapter import EngineAdapter, Lease, StepEvent
from glmlab.serve.backend import Finish, Progress, ServeError
from glmlab.serve.bootstrap import (
    BootstrapClient,
    PeerInfo,
    RoomMessage,
    RoomTable,
    bootstrap_app,
)
from glmlab.serve.config import WorkerConfig
from glmlab.serve.kvplan import AUX, cache_tensors, new_aux, row_copies
from glmlab.serve.schemas import GenRequest
from glmlab.serve.transfer import PendingWrite, TransferAgent, TransferError, WriteState
from glmlab.serve.worker import Worker

OK, FAIL = "ok", "fail"


def prompt_hash(ids: list[int]) -> str:
    return hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()[:16]


def notif(room: int, status: str, detail: str | int) -> bytes:
    return f"glmlab:{room}:{status}:{detail}".encode()


def parse_notif(msg: bytes) -> tuple[int, str, str] | None:
    parts = msg.decode(errors="replace").split(":", 3)
    if len(parts) != 4 or parts[0] != "glmlab" or not parts[1].isdigit():
        return None
    return int(parts[1]), parts[2], parts[3]


class _PDWorker(Worker):
    """Registers the cache tensors and an aux row per state slot with one NIXL agent."""

    def __init__(self, wc: WorkerConfig, adapter: EngineAdapter):
        storage = adapter.storage
        self.tensors = cache_tensors(storage)
        self.aux = new_aux(storage.num_state_slots)
        name = f"glmlab-{wc.spec.role.value}-{wc.spec.host}-{wc.spec.port}-{time.time_ns()}"
        self.agent = TransferAgent(name, {**{n: t for n, (t, _) in self.tensors.items()},
                                          AUX: self.aux})
        super().__init__(wc, adapter)

    def peer_info(self) -> PeerInfo:
        return PeerInfo(self.agent.name, self.agent.metadata(), self.agent.regions,
                        self.eng.page_size)

    async def close(self) -> None:
        await super().close()
        self.agent.close()


# ------------------------------------------------------------------------------------ prefill
@dataclass
class _Push:
    msg: RoomMessage
    peer: PeerInfo
    started: float = field(default_factory=time.monotonic)
    write: PendingWrite | None = None
    first: tuple[int, float | None, int] | None = None  # token, logprob, cached tokens


class PrefillWorker(_PDWorker):
    def __init__(self, wc: WorkerConfig, adapter: EngineAdapter):
        self.rooms = RoomTable(expire_s=wc.transfer.bootstrap_timeout_s * 2)
        self.peers: dict[str, PeerInfo] = {}
        self.pushes: dict[str, _Push] = {}  # by rid
        self.bytes_sent = 0
        super().__init__(wc, adapter)

    def bootstrap_app(self):
        return bootstrap_app(self.peer_info, self._register_peer, self.rooms, self._on_cancel)

    async def _register_peer(self, peer: PeerInfo) -> None:
        def add():
            self.agent.add_peer(peer.metadata)
            self.peers[peer.agent_name] = peer

        await self.thread.call(add)

    async def _on_cancel(self, room: int, reason: str) -> dict:
        def cancel():
            for rid, p in list(self.pushes.items()):
                if p.msg.room == room:
                    if p.write is not None:
                        return {"posted": True}
                    self._fail(rid, f"decode cancelled the room: {reason}", notify=False)
            return {"posted": False}

        return await self.thread.call(cancel)

    def _busy(self) -> bool:
        return super()._busy() or any(p.write is not None for p in self.pushes.values())

    def _work(self) -> bool:
        did = super()._work()
        for rid, p in list(self.pushes.items()):
            if p.write is None:
                continue
            state = self.agent.poll(p.write)
            late = time.monotonic() - p.started > self.wc.transfer.transfer_timeout_s
            if state is WriteState.DONE:
                self._done(rid, p)
            elif state is WriteState.ERR or late:
                self.agent.release(p.write)
                self._fail(rid, "the NIXL WRITE " + ("timed out" if late else "failed"))
            did = True
        return did

    def _on_step_event(self, ev: StepEvent) -> None:
        p = self.pushes.get(ev.rid)
        if p is None:
            return super()._on_step_event(ev)
        if ev.finish is None or ev.finish.kind == "abort" or not ev.new_ids:
            self._fail(ev.rid, f"prefill ended without a token ({ev.finish})")
            return
        try:
            lease = self.eng.held_lease(ev.rid)
            first = ev.new_ids[0]
            lp = ev.new_logprobs[0] if ev.new_logprobs else None
            self.aux[lease.state_slot] = self.aux.new_tensor(
                [first, lp if lp is not None else float("nan"), lease.prefix_len,
                 p.msg.prompt_len])
            copies = row_copies(self.tensors, self.eng.page_size, self.eng.kpool, lease.pages,
                                lease.state_slot, lease.state_slot, p.msg)
            p.first = (first, lp, lease.prefix_len)
            p.write = self.agent.write(p.peer.agent_name, copies, p.peer.regions,
                                       notif(p.msg.room, OK, 0))
            self.timeline.add(ev.rid, "write_posted", room=p.msg.room, bytes=p.write.nbytes,
                              descs=p.write.num_descs)
        except (TransferError, KeyError, ValueError) as e:
            self._fail(ev.rid, f"cannot push the cache: {e}")

    def _done(self, rid: str, p: _Push) -> None:
        self.pushes.pop(rid)
        self.eng.release_held(rid)
        self.bytes_sent += p.write.nbytes
        self.timeline.add(rid, "write_done", room=p.msg.room, bytes=p.write.nbytes)
        token, lp, cached = p.first
        box = self.outboxes.get(rid)
        if box is not None:
            box.push(Progress((token,), None if lp is None else (lp,), cached,
                              Finish("length"), {"pd_transfer": {"bytes": p.write.nbytes}}))

    def _fail(self, rid: str, reason: str, notify: bool = True) -> None:
        p = self.pushes.pop(rid, None)
        self.eng.abort(rid)  # frees a running or a held request alike
        if p is None:
            return
        self.timeline.add(rid, "transfer_failed", room=p.msg.room, reason=reason)
        if notify:
            with contextlib.suppress(Exception):  # decode may be gone: its timeout covers it
                self.agent.send_notif(p.peer.agent_name, notif(p.msg.room, FAIL, reason))
        box = self.outboxes.get(rid)
        if box is not None:
            box.push(ServeError(f"prefill of room {p.msg.room} failed: {reason}", status=500))

    def _forget(self, rid: str, abort: bool) -> None:
        if abort:
            self.thread.post(lambda: self._fail(rid, "the request was aborted")
                             if rid in self.pushes else None)
        super()._forget(rid, abort)

    async def generate(self, req: GenRequest, ids: list[int]) -> AsyncIterator[Progress]:
        self._check_alive()
        b = req.bootstrap
        if b is None:
            raise ServeError("a prefill worker serves requests from the router only (no "
                             "bootstrap_room in the request)", status=400)
        self.timeline.add(req.rid, "waiting_room", room=b.room, prompt_len=len(ids))
        try:
            msg = await self.rooms.wait(b.room, self.wc.transfer.bootstrap_timeout_s)
        except TimeoutError as e:
            raise ServeError(str(e), status=504) from e
        except ConnectionAbortedError as e:
            raise ServeError(str(e), status=409) from e
        peer = self.peers.get(msg.decode_agent)
        problem = None
        if peer is None:
            problem = f"decode agent {msg.decode_agent!r} never registered"
        elif msg.prompt_len != len(ids) or msg.prompt_hash != prompt_hash(ids):
            problem = (f"decode tokenized the prompt differently ({msg.prompt_len} tokens, "
                       f"here {len(ids)})")
        if problem:
            if peer is not None:
                await self.thread.call(lambda: self.agent.send_notif(
                    peer.agent_name, notif(msg.room, FAIL, problem)))
            raise ServeError(f"room {msg.room}: {problem}", status=500)
        box = await self._register(req.rid)
        self.timeline.add(req.rid, "room_received", room=msg.room,
                          decode_prefix_len=msg.decode_prefix_len, pages=len(msg.dst_pages))

        def start():
            self.pushes[req.rid] = _Push(msg, peer)
            self.eng.submit_prefill(req.rid, ids, req.params, req.return_logprob)

        await self.thread.call(start)
        async for ev in self._drain(req.rid, box):
            yield ev

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "transfers_in_flight": len(self.pushes),
                "transfer_bytes_sent": self.bytes_sent}


# ------------------------------------------------------------------------------------- decode
@dataclass
class _Recv:
    rid: str
    room: int
    ids: list[int]
    req: GenRequest
    base: str
    meta: dict
    started: float = field(default_factory=time.monotonic)
    lease: Lease | None = None  # set when the engine admits the request
    expected_bytes: int = 0
    sent: bool = False  # the room message went out: the prefill may write into the lease
    abandoned: bool = False


class DecodeWorker(_PDWorker):
    def __init__(self, wc: WorkerConfig, adapter: EngineAdapter):
        self.importing: dict[str, _Recv] = {}  # by rid, from submission to landing
        self.quarantined: list[str] = []  # rids whose pages a live prefill may still write
        self.bytes_received = 0
        self.transfer_failures = 0
        super().__init__(wc, adapter)
        self.client = BootstrapClient(self.peer_info, self._add_peer)

    async def _add_peer(self, prefill: PeerInfo) -> str:
        return await self.thread.call(lambda: self.agent.add_peer(prefill.metadata))

    def _by_room(self, room: int) -> _Recv | None:
        return next((r for r in self.importing.values() if r.room == room), None)

    # engine thread -----------------------------------------------------------------------
    def _busy(self) -> bool:
        return super()._busy() or bool(self.importing)

    def _work(self) -> bool:
        did = super()._work()
        for rid, lease in self.eng.take_import_leases():
            r = self.importing.get(rid)
            if r is None:
                continue
            r.lease = lease
            box = self.outboxes.get(rid)
            if box is not None:
                box.push(lease)
        for _peer, raw in self.agent.take_notifs():
            parsed = parse_notif(raw)
            r = self._by_room(parsed[0]) if parsed else None
            if r is None or not r.sent:
                continue
            if parsed[1] == OK:
                self._landed(r)
            else:
                self._fail(r, f"prefill reported: {parsed[2]}")
            did = True
        return did

    def _landed(self, r: _Recv) -> None:
        del self.importing[r.rid]
        if r.abandoned:
            self.eng.abort(r.rid)
            return
        token, lp, cached, prompt_len = self.aux[r.lease.state_slot].tolist()
        if int(prompt_len) != len(r.ids):
            self.eng.abort(r.rid)
            self._push_error(r, f"the aux row of room {r.room} is inconsistent", 502)
            return
        ms = (time.monotonic() - r.started) * 1e3
        self.bytes_received += r.expected_bytes
        r.meta["pd_transfer"] = {
            "bytes": r.expected_bytes, "pages": len(r.lease.transfer_pages),
            "decode_prefix_len": r.lease.prefix_len, "prefill_cached_tokens": int(cached),
            "wait_ms": round(ms, 3)}
        self.timeline.add(r.rid, "transfer_landed", room=r.room, bytes=r.expected_bytes, ms=ms)
        lp = None if lp != lp else lp  # nan: the prefill computed no logprob
        ev = self.eng.complete_import(r.rid, int(token), lp)
        self._on_step_event(StepEvent(ev.rid, ev.new_ids, ev.new_logprobs, int(cached),
                                      ev.finish))

    def _fail(self, r: _Recv, reason: str, free: bool = True) -> None:
        self.importing.pop(r.rid, None)
        self.transfer_failures += 1
        if free:
            self.eng.abort(r.rid)
        else:
            self.quarantined.append(r.rid)  # stays parked in the engine, pages untouched
        self.timeline.add(r.rid, "transfer_failed", room=r.room, reason=reason, freed=free)
        self._push_error(r, f"room {r.room}: {reason}", 502)

    def _push_error(self, r: _Recv, message: str, status: int) -> None:
        box = self.outboxes.get(r.rid)
        if box is not None and not r.abandoned:
            box.push(ServeError(message, status=status))

    def _forget(self, rid: str, abort: bool) -> None:
        def drop():
            self.outboxes.pop(rid, None)
            r = self.importing.get(rid)
            if r is not None and r.sent:
                r.abandoned = True  # the notification or the watcher frees it
            elif abort:
                self.importing.pop(rid, None)
                self.eng.abort(rid)

        self.thread.post(drop)

    # asyncio side ------------------------------------------------------------------------
    async def _watch(self, r: _Recv) -> None:
        """Fail the room when the prefill stops answering or the transfer takes too long."""
        t = self.wc.transfer
        deadline = r.started + t.transfer_timeout_s
        while r.rid in self.importing:
            await asyncio.sleep(t.peer_check_interval_s)
            if r.rid not in self.importing:
                return
            if r.sent and not await self.client.alive(r.base):
                self.client.forget(r.base)
                await self._fail_later(r, f"the prefill at {r.base} stopped answering; "
                                          "freed the request", free=True)
                return
            if time.monotonic() < deadline:
                continue
            posted = False
            if r.sent:
                answer = await self.client.cancel_room(r.base, r.room, "decode timed out")
                posted = bool(answer and answer.get("posted"))
                if posted and time.monotonic() < deadline + t.transfer_timeout_s:
                    continue  # its WRITE is in flight: wait for the notification a bit longer
            what = "transfer" if r.sent else "admission into the decode pools"
            await self._fail_later(r, f"no {what} within {t.transfer_timeout_s:.0f} s",
                                   free=not posted)
            return

    async def _fail_later(self, r: _Recv, reason: str, free: bool) -> None:
        await self.thread.call(lambda: self._fail(r, reason, free)
                               if r.rid in self.importing else None)

    async def generate(self, req: GenRequest, ids: list[int]) -> AsyncIterator[Progress]:
        self._check_alive()
        b = req.bootstrap
        if b is None:
            raise ServeError("a decode worker serves requests from the router only (no "
                             "bootstrap_room in the request)", status=400)
        base = self.client.base_url(b.host, b.port)
        try:
            await self.client.connect(base)
        except Exception as e:  # noqa: BLE001 - any failure to pair is the same answer
            self.client.forget(base)
            raise ServeError(f"cannot pair with the prefill at {base}: {e}", status=502) from e
        box = await self._register(req.rid)
        r = _Recv(req.rid, b.room, ids, req, base, {})

        def submit():
            self.importing[req.rid] = r
            self.eng.submit_import(req.rid, ids, req.params, req.return_logprob)

        await self.thread.call(submit)
        asyncio.get_running_loop().create_task(self._watch(r))
        try:
            lease = await box.get()  # the engine admitted it (or something failed)
            if isinstance(lease, BaseException):
                raise lease
            await self._send_room(r, lease)
        except BaseException:
            self._forget(req.rid, abort=True)
            raise
        async for ev in self._drain(req.rid, box, r.meta):
            yield ev

    async def _send_room(self, r: _Recv, lease: Lease) -> None:
        msg = RoomMessage(r.room, self.agent.name, len(r.ids), prompt_hash(r.ids),
                          lease.prefix_len, tuple(lease.transfer_pages), lease.state_slot,
                          lease.state_slot)
        r.expected_bytes = self._expected_bytes(msg)
        self.timeline.add(r.rid, "room_sent", room=r.room, decode_prefix_len=lease.prefix_len,
                          pages=len(msg.dst_pages), expected_bytes=r.expected_bytes)
        r.sent = True
        try:
            await self.client.send_room(r.base, msg)
        except Exception as e:  # noqa: BLE001
            await self._fail_later(r, f"cannot send the room message: {e}", free=True)

    def _expected_bytes(self, msg: RoomMessage) -> int:
        copies = row_copies(self.tensors, self.eng.page_size, self.eng.kpool,
                            list(range(self.eng.pages_for(msg.prompt_len))), 0, 0, msg)
        return sum(c.count * self.agent.regions[c.region].row_bytes for c in copies)

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "transfers_waiting": len(self.importing),
                "transfer_bytes_received": self.bytes_received,
                "transfer_failures": self.transfer_failures,
                "quarantined_requests": len(self.quarantined)}

    async def close(self) -> None:
        await self.client.close()
        await super().close()
