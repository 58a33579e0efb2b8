"""The prefill role of PD disaggregation: wait for decode's room, prefill, push the cache, free.

See pd.py for the protocol. The request is queued as ``hold_after_prefill``: the engine keeps its
pages and state after the first token (finish ``PREFILLED``), the worker writes the aux rows and
posts one NIXL WRITE of the pages decode lacks plus the state rows (and the drafter's hand-off
rows), polls it on the engine thread, then releases the request and answers the router with the
first token. A prompt with ``n`` samples is one such request (one prefill, in the room of sample
0): its samples 1..n-1 draw their first tokens from its row and end, and the one WRITE carries
every sample's first token in an aux row of its own. Under TP each follower posts its own rank's
WRITE (the ``push`` op) and reports it done; the request is released when every rank's is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field

from glmlab.core import FinishReason, RequestOutput, sample_rid
from glmlab.engine.engine import Engine
from glmlab.serve.bootstrap import PeerInfo, RoomMessage, RoomTable, bootstrap_app
from glmlab.serve.config import WorkerConfig
from glmlab.serve.errors import ServeError
from glmlab.serve.pd import FAIL, OK, PDWorker, notif, prompt_hash
from glmlab.serve.schemas import GenRequest
from glmlab.serve.transfer import PendingWrite, TransferError, WriteState
from glmlab.serve.worker import Records


@dataclass
class _Push:
    msg: RoomMessage
    peer: PeerInfo
    started: float = field(default_factory=time.monotonic)
    n: int = 1  # samples of the prompt
    write: PendingWrite | None = None
    firsts: dict[int, RequestOutput] = field(default_factory=dict)  # per sample: first token
    staged: list[int] = field(default_factory=list)  # aux rows of samples 1..n-1
    local_done: bool = False  # rank 0's WRITE completed
    nbytes: int = 0  # moved by every rank's WRITE, as each completed
    ranks_left: set[int] = field(default_factory=set)  # followers whose WRITE is not done


class PrefillWorker(PDWorker):
    def __init__(self, wc: WorkerConfig, engine: Engine, followers=None):
        self.rooms = RoomTable(expire_s=wc.transfer.bootstrap_timeout_s * 2)
        self.peers: dict[str, PeerInfo] = {}
        self.pushes: dict[str, _Push] = {}  # by rid
        self.samples: dict[str, tuple[str, int]] = {}  # sample rid -> (rid, index), n > 1
        self.bytes_sent = 0
        super().__init__(wc, engine, followers)

    def bootstrap_app(self):
        return bootstrap_app(self.peer_info, self._register_peer, self.rooms, self._on_cancel)

    async def _register_peer(self, peer: PeerInfo) -> None:
        def add():
            self._add_peer_everywhere(peer)
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

    # engine thread -----------------------------------------------------------------------
    def _busy(self) -> bool:
        return super()._busy() or any(p.write is not None for p in self.pushes.values())

    def _rank_work(self) -> bool:
        return any(p.ranks_left for p in self.pushes.values())

    def _work(self) -> bool:
        did = super()._work()
        for rid, p in list(self.pushes.items()):
            if p.write is None:
                if len(p.firsts) == p.n:  # every first token is in: waiting for aux rows
                    self._post(rid, p)
                continue
            late = time.monotonic() - p.started > self.wc.transfer.transfer_timeout_s
            state = WriteState.DONE if p.local_done else self.agent.poll(p.write)
            if state is WriteState.DONE and not p.local_done:
                p.local_done = True
                p.nbytes += p.write.nbytes
                if not p.ranks_left:
                    self._done(rid, p)
            if rid in self.pushes and (state is WriteState.ERR or late):
                self.agent.release(p.write)
                self._fail(rid, "the NIXL WRITE " + ("timed out" if late else "failed"))
            did = True
        return did

    def _on_reports(self, reports: list) -> None:
        from glmlab.serve.ranks import reports_of

        for rank, (_, rid, state, detail, nbytes) in reports_of(reports, "write"):
            p = self.pushes.get(rid)
            if p is None or rank not in p.ranks_left:
                continue  # failed or aborted meanwhile
            if state != WriteState.DONE.value:
                self._fail(rid, f"the NIXL WRITE of {detail} failed")
                continue
            p.ranks_left.discard(rank)
            p.nbytes += nbytes
            if not p.ranks_left and p.local_done:
                self._done(rid, p)

    def _on_output(self, out: RequestOutput) -> None:
        rid, index = self.samples.get(out.rid, (out.rid, 0))
        p = self.pushes.get(rid)
        if p is None:
            return super()._on_output(out)
        if out.finish_reason is not FinishReason.PREFILLED or not out.new_token_ids:
            # the first token ended the request here (EOS, max_new_tokens=1): nothing is held
            self._fail(rid, f"prefill ended without holding the cache ({out.finish_reason})")
            return
        p.firsts[index] = out
        if len(p.firsts) == p.n:  # the samples' first tokens come in the parent's step
            self._post(rid, p)

    def _post(self, rid: str, p: _Push) -> None:
        """Post the WRITE of ``rid``'s held cache with every sample's first token."""
        staged = self.shard.stage(p.n - 1)
        if staged is None:
            return  # other prompts' samples hold the staging rows: _work tries again
        p.staged = staged
        try:
            target = self.engine.export_target(rid)
            firsts = [(p.firsts[i].new_token_ids[0],
                       p.firsts[i].logprobs[0] if p.firsts[i].logprobs else None)
                      for i in range(p.n)]
            p.write = self.shard.push(target, p.msg, p.peer.agent_name, notif(p.msg.room, OK, 0),
                                      firsts=firsts, staged=staged)
            if self.followers is not None:  # each follower WRITEs its own rank's shard
                self.engine.post(("push", rid, p.peer.agent_name, p.msg.to_json(), p.msg.room))
                p.ranks_left = set(range(1, self.tp))
            self.timeline.add(rid, "write_posted", room=p.msg.room, bytes=p.write.nbytes,
                              descs=p.write.num_descs, ranks=self.tp, samples=p.n)
        except (TransferError, KeyError, ValueError) as e:
            self._fail(rid, f"cannot push the cache: {e}")

    def _rids(self, rid: str, p: _Push) -> list[str]:
        return [sample_rid(rid, i) for i in range(p.n)]

    def _done(self, rid: str, p: _Push) -> None:
        self.pushes.pop(rid)
        self.shard.unstage(p.staged)
        self.engine.release_held(rid)
        nbytes = p.nbytes  # every rank's WRITE: its own shard
        self.bytes_sent += nbytes
        self.timeline.add(rid, "write_done", room=p.msg.room, bytes=nbytes)
        for i, sid in enumerate(self._rids(rid, p)):
            self.samples.pop(sid, None)
            self.engine.forget(sid)
            box = self.outboxes.get(sid)
            if box is not None:
                box.push({"pd_transfer": {"bytes": nbytes}})
                # the router's answer from prefill: the first token, then "length" (decode
                # goes on)
                box.push(dataclasses.replace(p.firsts[i], finish_reason=FinishReason.LENGTH))

    def _fail(self, rid: str, reason: str, notify: bool = True) -> None:
        p = self.pushes.pop(rid, None)
        self._drop(rid)  # frees a running or a held request alike, on every rank
        if p is None:
            return
        self.shard.unstage(p.staged)  # a WRITE posted from them was released with its handle
        for sid in self._rids(rid, p)[1:]:
            self.samples.pop(sid, None)
            self._drop(sid)
        if p.ranks_left:
            self.engine.post(("drop", rid))
        self.timeline.add(rid, "transfer_failed", room=p.msg.room, reason=reason)
        if notify:
            with contextlib.suppress(Exception):  # decode may be gone: its timeout covers it
                self.agent.send_notif(p.peer.agent_name, notif(p.msg.room, FAIL, reason))
        for sid in self._rids(rid, p):
            box = self.outboxes.get(sid)
            if box is not None:
                box.push(ServeError(f"prefill of room {p.msg.room} failed: {reason}",
                                    status=500))

    def _forget(self, rid: str, abort: bool) -> None:
        if abort:  # any sample's client gone: the prompt's one push serves them all
            def fail():
                parent = self.samples.get(rid, (rid, 0))[0]
                if parent in self.pushes:
                    self._fail(parent, "the request was aborted")

            self.thread.post(fail)
        super()._forget(rid, abort)

    # asyncio side ------------------------------------------------------------------------
    async def open_samples(self, req: GenRequest, ids: list[int],
                           metas: list[dict]) -> list[Records]:
        """Wait for decode's message for the room of sample 0, then prefill the prompt once for
        its ``params.n`` samples (one record stream each)."""
        self._check_alive()
        b = (req.bootstraps or (req.bootstrap,))[0]
        if b is None:
            raise ServeError("a prefill worker serves requests from the router only (no "
                             "bootstrap_room in the request)", status=400)
        n = req.params.n
        self.timeline.add(req.rid, "waiting_room", room=b.room, prompt_len=len(ids), samples=n)
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
        elif len(msg.dst_aux_rows) != n:
            problem = f"decode expects {len(msg.dst_aux_rows)} samples of the prompt, here {n}"
        if problem:
            await self._tell_decode(peer, msg.room, problem)
            raise ServeError(f"room {msg.room}: {problem}", status=500)
        rids = [sample_rid(req.rid, i) for i in range(n)]
        boxes = await self._register_all(rids)
        self.timeline.add(req.rid, "room_received", room=msg.room,
                          decode_prefix_len=msg.decode_prefix_len, pages=len(msg.dst_pages))

        def start():
            self.engine.add_request(ids, req.params, rid=req.rid, hold_after_prefill=True,
                                    grammar=req.matcher())
            self.pushes[req.rid] = _Push(msg, peer, n=n)
            self.samples.update({rid: (req.rid, i) for i, rid in enumerate(rids) if i})

        try:
            await self.thread.call(start)
        except BaseException as e:  # decode admitted what this engine refuses (configs differ)
            for rid in rids:
                super()._forget(rid, abort=False)
            await self._tell_decode(peer, msg.room, f"prefill refused the request: {e}")
            raise
        return [self._records(rid, box, meta) for rid, box, meta in zip(rids, boxes, metas,
                                                                        strict=True)]

    async def _tell_decode(self, peer: PeerInfo | None, room: int, problem: str) -> None:
        if peer is not None:
            await self.thread.call(lambda: self.agent.send_notif(
                peer.agent_name, notif(room, FAIL, problem)))

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "transfers_in_flight": len(self.pushes),
                "transfer_bytes_sent": self.bytes_sent}
