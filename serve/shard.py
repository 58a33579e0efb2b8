"""One rank's cache shard as NIXL regions: what each rank of a PD worker sends or receives.

Every rank of a prefill or decode worker (one, or the ``tp`` ranks of a TP worker) registers, with
its own NIXL agent, once: its cache regions (``ModelCache.regions()``; under TP the latent rows and
pooled keys whole, the KDA state of its own heads), the drafter's hand-off rows when speculation
is on (``SpecPhase.handoff``), and the aux table (one row per state slot: the first token, its
logprob, prefill's cached tokens, the prompt length). Prefill rank r writes decode rank r, row for
row (the ranks' layouts are compared at pairing). Only rank 0 fills and sends the aux row: the
leader alone reads it.

This module knows an engine's regions and NIXL; not HTTP, rooms or the lockstep of ranks.
"""

from __future__ import annotations

import math

import torch

from glmlab.core import CacheTarget
from glmlab.serve.bootstrap import PeerInfo, RoomMessage
from glmlab.serve.kvplan import AUX, checked_regions, new_aux, row_copies
from glmlab.serve.transfer import PendingWrite, Region, TransferAgent, TransferError


class ShardTransfer:
    def __init__(self, engine, name: str, rank: int = 0):
        storage = engine.cache.storage
        self.rank, self.page_size = rank, storage.page_size
        self.kpool = storage.cfg.dsa.index_kpool
        regions = dict(storage.regions())
        self.drafter = ""
        if engine.spec is not None:  # prefill: its drafter learned the prompt; decode: adopts it
            regions.update(engine.spec.handoff.regions())
            self.drafter = engine.spec.handoff.describe()
        self.regions = checked_regions(regions)
        self.aux = new_aux(storage.num_state_slots, storage.device)
        self.agent = TransferAgent(name, {**{n: t for n, (t, _) in self.regions.items()},
                                          AUX: self.aux})
        # a peer worker (keyed by its rank 0's agent name) -> (this rank's peer agent, regions)
        self.peers: dict[str, tuple[str, dict[str, Region]]] = {}

    def info(self, ranks: tuple[PeerInfo, ...] = ()) -> PeerInfo:
        return PeerInfo(self.agent.name, self.agent.metadata(), self.agent.regions,
                        self.page_size, self.drafter, ranks)

    def add_peer(self, key: str, peer: PeerInfo) -> str:
        """Register ``peer`` (this rank's counterpart of the worker named ``key``)."""
        name = self.agent.add_peer(peer.metadata)
        self.peers[key] = (name, peer.regions)
        return name

    def push(self, target: CacheTarget, msg: RoomMessage, key: str, note: bytes,
             first: tuple[int, float] | None = None) -> PendingWrite:
        """One WRITE of a held request's rows into the peer ``key``'s rank; rank 0 passes the
        ``first`` token and its logprob, which travel in the aux row."""
        if key not in self.peers:
            raise TransferError(f"rank {self.rank}: decode agent {key!r} is not registered here")
        name, remote = self.peers[key]
        if first is not None:
            self.aux[target.state_slot] = self.aux.new_tensor(
                [first[0], first[1], target.prefix_len, msg.prompt_len])
        copies = row_copies(self.regions, self.page_size, self.kpool, list(target.pages),
                            target.state_slot, target.state_slot, msg, aux=first is not None)
        if self.aux.is_cuda:  # NIXL reads GPU memory outside torch's stream order
            torch.cuda.synchronize(self.aux.device)
        return self.agent.write(name, copies, remote, note)

    def expected_bytes(self, msg: RoomMessage, regions: dict[str, Region], aux: bool) -> int:
        """Bytes a push of ``msg`` moves into a rank whose regions are ``regions``."""
        pages = math.ceil(msg.prompt_len / self.page_size)
        copies = row_copies(self.regions, self.page_size, self.kpool, list(range(pages)), 0, 0,
                            msg, aux=aux)
        return sum(c.count * regions[c.region].row_bytes for c in copies)

    def read_aux(self, slot: int) -> tuple[int, float | None, int, int]:
        """(first token, its logprob or None, prefill's cached tokens, prompt length)."""
        token, lp, cached, prompt_len = self.aux[slot].tolist()
        return int(token), (None if lp != lp else lp), int(cached), int(prompt_len)

    def close(self) -> None:
        self.agent.close()
