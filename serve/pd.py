"""PD disaggregation: the protocol, the shared NIXL setup, and the prefill role (decode: decode.py).

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

import contextlib
import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import torch

from glmlab.serve.adapter import EngineAdapter, StepEvent
from glmlab.serve.backend import Finish, Progress, ServeError
from glmlab.serve.bootstrap import (
    PeerInfo,
    RoomMessage,
    RoomTable,
    bootstrap_app,
)
from glmlab.serve.config import WorkerConfig
from glmlab.serve.kvplan import AUX, checked_regions, new_aux, row_copies
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


class PDWorker(Worker):
    """Registers the cache tensors and an aux row per state slot with one NIXL agent."""

    def __init__(self, wc: WorkerConfig, adapter: EngineAdapter):
        storage = adapter.storage
        self.regions = checked_regions(storage.regions())
        self.aux = new_aux(storage.num_state_slots, storage.device)
        name = f"glmlab-{wc.spec.role.value}-{wc.spec.host}-{wc.spec.port}-{time.time_ns()}"
        self.agent = TransferAgent(name, {**{n: t for n, (t, _) in self.regions.items()},
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


class PrefillWorker(PDWorker):
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
            copies = row_copies(self.regions, self.eng.page_size, self.eng.kpool, lease.pages,
                                lease.state_slot, lease.state_slot, p.msg)
            p.first = (first, lp, lease.prefix_len)
            if self.aux.is_cuda:  # NIXL reads GPU memory outside torch's stream order
                torch.cuda.synchronize(self.aux.device)
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
