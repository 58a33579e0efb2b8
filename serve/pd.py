"""PD disaggregation: the protocol and what both roles share (the roles: prefill.py, decode.py).

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

import hashlib
import time

from glmlab.engine.engine import Engine
from glmlab.serve.bootstrap import PeerInfo
from glmlab.serve.config import WorkerConfig
from glmlab.serve.kvplan import AUX, checked_regions, new_aux
from glmlab.serve.transfer import TransferAgent
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
    """Registers the cache regions and an aux row per state slot with one NIXL agent."""

    def __init__(self, wc: WorkerConfig, engine: Engine):
        storage = engine.cache.storage
        self.page_size, self.kpool = storage.page_size, storage.cfg.dsa.index_kpool
        self.regions = checked_regions(storage.regions())
        self.aux = new_aux(storage.num_state_slots, storage.device)
        name = f"glmlab-{wc.spec.role.value}-{wc.spec.host}-{wc.spec.port}-{time.time_ns()}"
        self.agent = TransferAgent(name, {**{n: t for n, (t, _) in self.regions.items()},
                                          AUX: self.aux})
        super().__init__(wc, engine)

    def peer_info(self) -> PeerInfo:
        return PeerInfo(self.agent.name, self.agent.metadata(), self.agent.regions,
                        self.page_size)

    async def close(self) -> None:
        await super().close()
        self.agent.close()
