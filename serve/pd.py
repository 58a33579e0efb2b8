"""PD disaggregation: the protocol and what both roles share (the roles: prefill.py, decode.py).

Per request (same ``bootstrap_room`` on both sides, from the router):

decode  reserve pages + a state slot after a kv_only radix match -> POST /rooms/{room} to the
        prefill's listener (its pages for the uncached part of the prompt) -> wait for the NIXL
        notification -> read the aux row (first token) -> the engine continues decoding.
prefill wait for the room message -> prefill the prompt (the engine keeps the request's pages and
        state after it finishes) -> one NIXL WRITE of the missing pages, the state rows and the aux
        row, notifying ``glmlab:{room}:ok:{bytes}`` -> free the pages -> answer the router.

A prompt with ``n`` samples (no grammar, no speculation) is one request on both sides, in the
room of sample 0: decode reserves the pages once and a state slot per sample, its message names
an aux row per sample; prefill computes the prompt once, every sample draws its first token from
the last row (with its own seed), and the one WRITE carries the pages and state once and each
sample's first token (with its logprob and top alternatives) in its row; decode forks the
samples from the landed import (whole pages shared, state copied). /metrics shows it:
``sglang:realtime_tokens_total{mode="prefill_compute"}`` grows by the prompt once.

Speculation: both roles run the same drafter; prefill's learns the prompt as a mixed engine's does
and its hand-off rows (``glmlab.speculative.handoff``) travel with the cache rows, so decode
verifies from its first step (``complete_import(..., draft_state=True)``).

Under TP every rank does its own part: prefill rank r WRITEs its shard into decode rank r, whose
agent gets the notification; decode's leader completes the import once every rank's has come,
prefill's leader releases the request once every rank's WRITE is done (ranks.py).

Failures are reported to both sides and always free what the request held: a prefill error sends
``glmlab:{room}:fail:{reason}``; decode gives up after ``transfer_timeout_s`` or as soon as the
prefill's listener stops answering, telling the prefill with ``DELETE /rooms/{room}``. Pages that
a live prefill may still be writing into (the WRITE was already posted) are not reused until its
notification arrives.
"""

from __future__ import annotations

import hashlib

from glmlab.engine.engine import Engine
from glmlab.serve.bootstrap import PeerInfo
from glmlab.serve.config import WorkerConfig
from glmlab.serve.shard import ShardTransfer
from glmlab.serve.transfer import TransferError
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
    """Registers this rank's cache regions (and drafter rows) and an aux row per state slot with
    one NIXL agent (``shard.ShardTransfer``); the followers of a TP worker hold their own."""

    def __init__(self, wc: WorkerConfig, engine: Engine, followers=None):
        from glmlab.serve.ranks import agent_name

        self.shard = ShardTransfer(engine, agent_name(wc, 0))
        self.agent, self.page_size = self.shard.agent, self.shard.page_size
        self.tp = wc.spec.tp
        super().__init__(wc, engine, followers)

    def one_prefill(self, req) -> bool:
        """A prompt's n samples are one prefill and one import unless speculation is on (its
        drafter state is per request, so each sample is then its own room)."""
        return super().one_prefill(req) and self.engine.spec is None

    def peer_info(self) -> PeerInfo:
        ranks = self.followers.infos if self.followers is not None else ()
        return self.shard.info(ranks)

    def _add_peer_everywhere(self, peer: PeerInfo) -> str:
        """Register ``peer`` with every rank (engine thread); rank 0's name for it."""
        name = self.shard.add_peer(peer.agent_name, peer)
        if self.followers is not None:
            from glmlab.serve.ranks import reports_of

            self.engine.post(("add_peer", peer.agent_name,
                              [peer.rank(r).to_json() for r in range(peer.tp_size)]))
            reports = self.engine.sync()
            self._on_reports(reports)
            errors = [it[3] for _, it in reports_of(reports, "peer") if it[2] is None]
            if errors:
                raise TransferError("; ".join(errors))
        return name

    async def close(self) -> None:
        await super().close()
        self.shard.close()
