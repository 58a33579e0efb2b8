"""One rank's cache shard as NIXL regions: what each rank of a PD worker sends or receives.

Every rank of a prefill or decode worker (one, or the ``tp`` ranks of a TP worker) registers, with
its own NIXL agent, once: its cache regions (``ModelCache.regions()``; under TP the latent rows and
pooled keys whole, the KDA state of its own heads), the drafter's hand-off rows when speculation
is on (``SpecPhase.handoff``), and the aux table (kvplan.aux_row: a sample's first token, its
logprob and top alternatives, prefill's cached tokens, the prompt length): one row per state
slot, where decode reads each sample's, then ``STAGING_ROWS`` rows from which prefill sends the
first tokens of a prompt's samples 1..n-1 (sample 0's leaves from its state slot's row). Prefill
rank r writes decode rank r, row for row (the ranks' layouts are compared at pairing). Only rank 0
fills and sends the aux rows: the leader alone reads them.

This module knows an engine's regions and NIXL; not HTTP, rooms or the lockstep of ranks.
"""

from __future__ import annotations

import math

import torch

from glmlab.core import MAX_SAMPLES, CacheTarget, TokenLogprob
from glmlab.serve.bootstrap import PeerInfo, RoomMessage
from glmlab.serve.kvplan import AUX, aux_row, checked_regions, new_aux, read_aux_row, row_copies
from glmlab.serve.transfer import PendingWrite, Region, TransferAgent, TransferError

STAGING_ROWS = 4 * MAX_SAMPLES  # prefill: samples 1..n-1 of the prompts being pushed at once
First = tuple[int, TokenLogprob | None]  # a sample's first token and its logprob (if asked)


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
        self.num_slots = storage.num_state_slots
        self.aux = new_aux(self.num_slots + STAGING_ROWS, storage.device)
        self._staging = list(range(self.num_slots + STAGING_ROWS - 1, self.num_slots - 1, -1))
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

    def stage(self, num: int) -> list[int] | None:
        """``num`` staging aux rows (samples 1..n-1 of one push), or None while too few are free
        (the push waits for earlier ones to complete)."""
        if num > len(self._staging):
            return None
        return [self._staging.pop() for _ in range(num)]

    def unstage(self, rows: list[int]) -> None:
        self._staging.extend(rows)

    def push(self, target: CacheTarget, msg: RoomMessage, key: str, note: bytes,
             firsts: list[First] | None = None, staged: list[int] = ()) -> PendingWrite:
        """One WRITE of a held request's rows into the peer ``key``'s rank; rank 0 passes every
        sample's first token (``firsts``), which travel in the aux rows: sample 0's from the
        state slot's row, the others' from the ``staged`` rows."""
        if key not in self.peers:
            raise TransferError(f"rank {self.rank}: decode agent {key!r} is not registered here")
        name, remote = self.peers[key]
        rows = [target.state_slot, *staged]
        if firsts is not None:
            if len(firsts) != len(rows):
                raise TransferError(f"{len(firsts)} first tokens for {len(rows)} aux rows")
            self.aux[rows] = self.aux.new_tensor(
                [aux_row(t, lp, target.prefix_len, msg.prompt_len) for t, lp in firsts])
        copies = row_copies(self.regions, self.page_size, self.kpool, list(target.pages),
                            target.state_slot, rows, msg, aux=firsts is not None)
        if self.aux.is_cuda:  # NIXL reads GPU memory outside torch's stream order
            torch.cuda.synchronize(self.aux.device)
        return self.agent.write(name, copies, remote, note)

    def expected_bytes(self, msg: RoomMessage, regions: dict[str, Region], aux: bool) -> int:
        """Bytes a push of ``msg`` moves into a rank whose regions are ``regions``."""
        pages = math.ceil(msg.prompt_len / self.page_size)
        copies = row_copies(self.regions, self.page_size, self.kpool, list(range(pages)), 0,
                            list(msg.dst_aux_rows), msg, aux=aux)
        return sum(c.count * regions[c.region].row_bytes for c in copies)

    def read_aux(self, row: int) -> tuple[int, TokenLogprob | None, int, int]:
        """(first token, its logprob with alternatives or None, prefill's cached tokens,
        prompt length) of the sample whose aux row is ``row``."""
        return read_aux_row(self.aux[row].tolist())

    def close(self) -> None:
        self.agent.close()
