"""The decode role of PD disaggregation: admit with a kv_only match, receive, continue.

See pd.py for the protocol. Decode queues the request as *imported* (the engine validates it
here; a refused request also cancels its room at the prefill); once the engine admits it
(pages for the part of the prompt its radix tree lacks, a state slot), it posts the room message
to the prefill's listener and waits for the NIXL notification; a watcher fails the room when the
prefill stops answering or ``transfer_timeout_s`` passes, and everything the request held is
freed (or, when a live prefill may still be writing into its pages, kept out of use). Under TP
each rank's agent gets the notification of its own rank's WRITE (the followers report theirs);
the import completes only when every rank's has arrived. With speculation on, the drafter rows
landed too and the engine adopts them (``complete_import(..., draft_state=True)``). A prompt with
``n`` samples is ONE import (pages once, a state slot per sample, one room message with an aux
row per sample): when it lands, the engine forks the samples from it with the first tokens the
prefill drew for each (``complete_import(..., samples=...)``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from glmlab.core import CacheTarget, sample_rid
from glmlab.engine.engine import Engine
from glmlab.serve.bootstrap import BootstrapClient, PeerInfo, RoomMessage
from glmlab.serve.config import WorkerConfig
from glmlab.serve.errors import ServeError
from glmlab.serve.pd import OK, PDWorker, parse_notif, prompt_hash
from glmlab.serve.schemas import GenRequest
from glmlab.serve.worker import Records


@dataclass
class _Recv:
    rid: str
    room: int
    ids: list[int]
    base: str
    n: int = 1  # samples of the prompt (one import for all)
    started: float = field(default_factory=time.monotonic)
    lease: CacheTarget | None = None  # set when the engine admits the request
    expected_bytes: int = 0
    sent: bool = False  # the room message went out: the prefill may write into the lease
    abandoned: bool = False
    landed: set[int] = field(default_factory=set)  # ranks whose WRITE notification arrived

    @property
    def rids(self) -> list[str]:
        return [sample_rid(self.rid, i) for i in range(self.n)]


class DecodeWorker(PDWorker):
    def __init__(self, wc: WorkerConfig, engine: Engine, followers=None):
        self.importing: dict[str, _Recv] = {}  # by rid, from submission to landing
        self.quarantined: list[str] = []  # rids whose pages a live prefill may still write
        self.bytes_received = 0
        self.transfer_failures = 0
        super().__init__(wc, engine, followers)
        self.client = BootstrapClient(self.peer_info, self._add_peer)

    async def _add_peer(self, prefill: PeerInfo) -> str:
        return await self.thread.call(lambda: self._add_peer_everywhere(prefill))

    def _by_room(self, room: int) -> _Recv | None:
        return next((r for r in self.importing.values() if r.room == room), None)

    # engine thread -----------------------------------------------------------------------
    def _busy(self) -> bool:
        return super()._busy() or bool(self.importing)

    def _work(self) -> bool:
        did = super()._work()
        for lease in self.engine.import_targets():
            r = self.importing.get(lease.rid)
            if r is None or r.lease is not None:
                continue  # not ours to report, or reported at an earlier round
            r.lease = lease
            box = self.outboxes.get(lease.rid)
            if box is not None:
                box.push(lease)
        for _peer, raw in self.agent.take_notifs():
            did = self._on_notif(0, raw) or did
        return did

    def _rank_work(self) -> bool:
        return any(r.sent for r in self.importing.values())

    def _on_reports(self, reports: list) -> None:
        from glmlab.serve.ranks import reports_of

        for rank, (_, raw) in reports_of(reports, "notif"):
            self._on_notif(rank, raw)

    def _on_notif(self, rank: int, raw: bytes) -> bool:
        """Rank ``rank``'s agent received ``raw``; whether it was about a room of ours."""
        parsed = parse_notif(raw)
        r = self._by_room(parsed[0]) if parsed else None
        if r is None or not r.sent:
            return False
        if parsed[1] != OK:
            self._fail(r, f"prefill reported: {parsed[2]}")
            return True
        r.landed.add(rank)
        if len(r.landed) == self.tp:  # every rank's shard is in place
            self._landed(r)
        return True

    def _landed(self, r: _Recv) -> None:
        del self.importing[r.rid]
        if r.abandoned:
            self._drop(r.rid)
            return
        rows = [self.shard.read_aux(row) for row in (r.lease.state_slot,
                                                     *r.lease.sample_slots)]
        token, lp, cached, _ = rows[0]
        if any(prompt_len != len(r.ids) for *_, prompt_len in rows):
            self._drop(r.rid)
            self._push_error(r, f"the aux rows of room {r.room} are inconsistent", 502)
            return
        ms = (time.monotonic() - r.started) * 1e3
        self.bytes_received += r.expected_bytes
        self.timeline.add(r.rid, "transfer_landed", room=r.room, bytes=r.expected_bytes, ms=ms,
                          samples=r.n)
        for rid in r.rids:
            box = self.outboxes.get(rid)
            if box is not None:  # meta_info of the answer
                box.push({"pd_transfer": {
                    "bytes": r.expected_bytes, "pages": len(r.lease.transfer_pages),
                    "decode_prefix_len": r.lease.prefix_len, "prefill_cached_tokens": cached,
                    "wait_ms": round(ms, 3), "ranks": self.tp, "samples": r.n}})
        outs = self.engine.complete_import(r.rid, token, lp,
                                           draft_state=self.engine.spec is not None,
                                           samples=[(t, tl) for t, tl, _, _ in rows[1:]])
        for out in outs:
            self._on_output(out)
        for rid in r.rids[1:]:
            if rid not in self.outboxes:  # that sample's client left while the cache moved
                self._drop(rid)

    def _fail(self, r: _Recv, reason: str, free: bool = True) -> None:
        self.importing.pop(r.rid, None)
        self.transfer_failures += 1
        if free:
            self._drop(r.rid)
        else:
            self.quarantined.append(r.rid)  # stays parked in the engine, pages untouched
        self.timeline.add(r.rid, "transfer_failed", room=r.room, reason=reason, freed=free)
        self._push_error(r, f"room {r.room}: {reason}", 502)

    def _push_error(self, r: _Recv, message: str, status: int) -> None:
        for rid in r.rids:
            box = self.outboxes.get(rid)
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
                self._drop(rid)

        self.thread.post(drop)
        r = self.importing.get(rid)
        if abort and r is not None:  # the client left: the prefill need not wait or compute
            asyncio.get_running_loop().create_task(self._cancel_room(r))

    async def _cancel_room(self, r: _Recv) -> None:
        """Tell the prefill that the client of ``r`` left (its room message may have gone out);
        free ``r`` here at once unless the prefill's WRITE is in flight, whose notification
        frees it (a notification alone can reach decode late: it leaves an idle prefill only
        when its NIXL agent next progresses)."""
        answer = await self.client.cancel_room(r.base, r.room, "the client went away")
        if r.sent and answer is not None and not answer.get("posted"):
            await self.thread.call(lambda: self._release(r))

    def _release(self, r: _Recv) -> None:
        if self.importing.pop(r.rid, None) is not None:
            self._drop(r.rid)
            self.timeline.add(r.rid, "abandoned", room=r.room)

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

    async def open_samples(self, req: GenRequest, ids: list[int],
                           metas: list[dict]) -> list[Records]:
        """Admit the prompt as one import for its ``params.n`` samples, send the room message
        of sample 0's room (before sample 0's records), and stream every sample's records."""
        self._check_alive()
        b = (req.bootstraps or (req.bootstrap,))[0]
        if b is None:
            raise ServeError("a decode worker serves requests from the router only (no "
                             "bootstrap_room in the request)", status=400)
        base = self.client.base_url(b.host, b.port)
        try:
            await self.client.connect(base)
        except Exception as e:  # noqa: BLE001 - any failure to pair is the same answer
            self.client.forget(base)
            raise ServeError(f"cannot pair with the prefill at {base}: {e}", status=502) from e
        r = _Recv(req.rid, b.room, ids, base, n=req.params.n)
        boxes = await self._register_all(r.rids)

        def submit():
            self.engine.add_request(ids, req.params, rid=req.rid, imported=True,
                                    grammar=req.matcher())
            self.importing[req.rid] = r

        try:
            await self.thread.call(submit)
        except BaseException as e:
            for rid in r.rids:
                super()._forget(rid, abort=False)
            # the prefill waits for this room: tell it now rather than let it time out
            await self.client.cancel_room(base, b.room, f"decode refused the request: {e}")
            raise
        asyncio.get_running_loop().create_task(self._watch(r))

        async def admitted():  # before the records: the engine admits it, the room goes out
            lease = await boxes[0].get()
            if isinstance(lease, BaseException):
                raise lease
            await self._send_room(r, lease)

        return [self._records(rid, box, meta, admitted if i == 0 else None)
                for i, (rid, box, meta) in enumerate(zip(r.rids, boxes, metas, strict=True))]

    async def _send_room(self, r: _Recv, lease: CacheTarget) -> None:
        msg = RoomMessage(r.room, self.agent.name, len(r.ids), prompt_hash(r.ids),
                          lease.prefix_len, tuple(lease.transfer_pages), lease.state_slot,
                          (lease.state_slot, *lease.sample_slots))
        r.expected_bytes = self._expected_bytes(msg)
        self.timeline.add(r.rid, "room_sent", room=r.room, decode_prefix_len=lease.prefix_len,
                          pages=len(msg.dst_pages), expected_bytes=r.expected_bytes)
        r.sent = True
        try:
            await self.client.send_room(r.base, msg)
        except Exception as e:  # noqa: BLE001
            await self._fail_later(r, f"cannot send the room message: {e}", free=True)

    def _expected_bytes(self, msg: RoomMessage) -> int:
        """What every rank's WRITE of ``msg`` moves together (rank 0 with the aux row)."""
        ranks = [self.agent.regions] + [i.regions for i in
                                        (self.followers.infos if self.followers else ())]
        return sum(self.shard.expected_bytes(msg, regions, aux=r == 0)
                   for r, regions in enumerate(ranks))

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "transfers_waiting": len(self.importing),
                "transfer_bytes_received": self.bytes_received,
                "transfer_failures": self.transfer_failures,
                "quarantined_requests": len(self.quarantined)}

    async def close(self) -> None:
        await self.client.close()
        await super().close()
