"""NIXL transfer of cache rows from a prefill worker into a decode worker (push with WRITE).

A worker registers its cache tensors with one NIXL agent, once, at start-up. Each registered
tensor is a *region*: ``num_rows`` rows of ``row_bytes`` bytes (a token slot, an indexer pool or
a request's state slot, depending on the tensor). The decode worker publishes its regions'
addresses; the prefill worker turns "copy my rows a..b of region R into the peer's rows c..d"
into NIXL descriptors (consecutive rows merged into one descriptor), posts one WRITE carrying a
notification, and polls it to completion. The decode worker sees the notification arrive.

docs/platform.md section 3.3: between two processes only WRITE (push) takes the fast path, so the
prefill side always initiates. Section 2.4: ``add_remote_agent`` returns the peer's name as bytes
while notifications are keyed by str, so names are decoded here once.

This module knows about bytes, rows and agents; which rows a request needs (pages, state slots)
is decided by the caller (``glmlab.serve.kvplan``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from enum import Enum

import numpy as np
import torch


class TransferError(RuntimeError):
    """A transfer that failed, timed out, or cannot be described (mismatched layouts)."""


class WriteState(str, Enum):
    DONE = "DONE"
    PROC = "PROC"
    ERR = "ERR"


@dataclass(frozen=True)
class Region:
    """One registered tensor seen as rows: where it lives and how wide a row is."""

    name: str
    addr: int
    row_bytes: int
    num_rows: int
    device_id: int = 0  # NIXL's device id: the CUDA ordinal for VRAM, 0 for host memory
    vram: bool = False  # GPU memory (NIXL VRAM_SEG) rather than host memory (DRAM_SEG)

    @property
    def mem_type(self) -> str:
        return "VRAM" if self.vram else "DRAM"

    def to_json(self) -> dict:
        return {"name": self.name, "addr": self.addr, "row_bytes": self.row_bytes,
                "num_rows": self.num_rows, "device_id": self.device_id, "vram": self.vram}

    @classmethod
    def from_json(cls, d: dict) -> Region:
        return cls(str(d["name"]), int(d["addr"]), int(d["row_bytes"]), int(d["num_rows"]),
                   int(d.get("device_id", 0)), bool(d.get("vram", False)))


def region_of(name: str, t: torch.Tensor) -> Region:
    """A contiguous tensor viewed as rows along its first dimension."""
    if not t.is_contiguous():
        raise TransferError(f"region {name}: tensor must be contiguous")
    rows = t.shape[0]
    row_bytes = t[0].numel() * t.element_size() if rows else 0
    device_id = (t.device.index or 0) if t.is_cuda else 0
    return Region(name, t.data_ptr(), row_bytes, rows, device_id, vram=t.is_cuda)


@dataclass(frozen=True)
class RowCopy:
    """Copy ``count`` rows of region ``region`` from local row ``src`` to the peer's row ``dst``."""

    region: str
    src: int
    dst: int
    count: int = 1


def merge_runs(copies: list[RowCopy]) -> list[RowCopy]:
    """Fuse copies that continue each other in both source and destination rows."""
    out: list[RowCopy] = []
    for c in copies:
        last = out[-1] if out else None
        if (last is not None and last.region == c.region and last.src + last.count == c.src
                and last.dst + last.count == c.dst):
            out[-1] = RowCopy(c.region, last.src, last.dst, last.count + c.count)
        else:
            out.append(c)
    return out


def mem_types(copies: list[RowCopy], local: dict[str, Region],
              remote: dict[str, Region]) -> tuple[str, str]:
    """The one memory type of each side of a WRITE (NIXL takes one per descriptor list)."""
    kinds = {(local[c.region].mem_type, remote[c.region].mem_type) for c in copies
             if c.region in local and c.region in remote}
    if len(kinds) > 1:
        raise TransferError(f"one WRITE mixes host and GPU memory: {sorted(kinds)}; keep every "
                            "registered region of a worker on the cache's device")
    return kinds.pop() if kinds else ("DRAM", "DRAM")


def descriptors(copies: list[RowCopy], local: dict[str, Region],
                remote: dict[str, Region]) -> tuple[np.ndarray, np.ndarray, int]:
    """(local Nx3, remote Nx3, total bytes) NIXL descriptor arrays of (address, length, device)."""
    src = np.zeros((len(copies), 3), dtype=np.uint64)
    dst = np.zeros((len(copies), 3), dtype=np.uint64)
    total = 0
    for i, c in enumerate(copies):
        lo, re = local.get(c.region), remote.get(c.region)
        if lo is None or re is None:
            raise TransferError(f"region {c.region!r} is not registered on both sides")
        if lo.row_bytes != re.row_bytes:
            raise TransferError(f"region {c.region!r}: row of {lo.row_bytes} B here but "
                                f"{re.row_bytes} B on the peer (different cache layouts)")
        if c.count < 1 or c.src < 0 or c.dst < 0 or c.src + c.count > lo.num_rows \
                or c.dst + c.count > re.num_rows:
            raise TransferError(f"region {c.region!r}: rows {c} out of range "
                                f"({lo.num_rows} here, {re.num_rows} on the peer)")
        n = c.count * lo.row_bytes
        src[i] = (lo.addr + c.src * lo.row_bytes, n, lo.device_id)
        dst[i] = (re.addr + c.dst * re.row_bytes, n, re.device_id)
        total += n
    return src, dst, total


@dataclass
class PendingWrite:
    """A posted WRITE: poll it with ``TransferAgent.poll`` until DONE or ERR."""

    peer: str
    handle: object
    nbytes: int
    num_descs: int
    posted_at: float


class TransferAgent:
    """One NIXL agent (UCX backend) with this worker's cache tensors registered once."""

    def __init__(self, name: str, tensors: dict[str, torch.Tensor]):
        from nixl_cu13._api import nixl_agent, nixl_agent_config

        self.name = name
        # no progress thread: it spins a core; the engine thread polls the agent instead
        self._agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False,
                                                         backends=["UCX"]))
        if "UCX" not in self._agent.backends:
            raise TransferError("NIXL has no UCX backend on this machine")
        live = [t for t in tensors.values() if t.numel()]
        self._reg = self._agent.register_memory(live) if live else None
        self.regions = {n: region_of(n, t) for n, t in tensors.items()}
        self._peers: set[str] = set()

    # metadata --------------------------------------------------------------------------------
    def metadata(self) -> bytes:
        return self._agent.get_agent_metadata()

    def add_peer(self, metadata: bytes) -> str:
        name = self._agent.add_remote_agent(metadata)
        name = name.decode() if isinstance(name, bytes) else str(name)  # docs/platform.md 2.4
        self._peers.add(name)
        return name

    def remove_peer(self, name: str) -> None:
        if name in self._peers:
            self._peers.discard(name)
            self._agent.remove_remote_agent(name)

    # initiator side --------------------------------------------------------------------------
    def write(self, peer: str, copies: list[RowCopy], remote: dict[str, Region],
              notif: bytes) -> PendingWrite:
        """Post one WRITE of ``copies`` into ``peer``; the peer sees ``notif`` when it lands."""
        if peer not in self._peers:
            raise TransferError(f"unknown peer {peer!r}: register it first")
        copies = merge_runs(copies)
        if not copies:
            self.send_notif(peer, notif)
            return PendingWrite(peer, None, 0, 0, time.monotonic())
        src, dst, total = descriptors(copies, self.regions, remote)
        src_mem, dst_mem = mem_types(copies, self.regions, remote)
        try:
            handle = self._agent.initialize_xfer(
                "WRITE", self._agent.get_xfer_descs(src, src_mem),
                self._agent.get_xfer_descs(dst, dst_mem), peer, notif)
            state = self._agent.transfer(handle)
        except Exception as e:  # nixl raises its own error types from the bindings
            raise TransferError(f"posting a WRITE of {total} B to {peer} failed: {e}") from e
        if state == WriteState.ERR:
            handle.release()
            raise TransferError(f"posting a WRITE of {total} B to {peer} failed")
        return PendingWrite(peer, handle, total, len(copies), time.monotonic())

    def poll(self, w: PendingWrite) -> WriteState:
        if w.handle is None:
            return WriteState.DONE
        try:
            state = WriteState(self._agent.check_xfer_state(w.handle))
        except Exception:  # a peer that vanished shows up as a binding error on some paths
            state = WriteState.ERR
        if state is not WriteState.PROC:
            self.release(w)
        return state

    def release(self, w: PendingWrite) -> None:
        if w.handle is not None:
            # still in flight: NIXL refuses to free it, and the agent reaps it later
            with contextlib.suppress(Exception):
                w.handle.release()
            w.handle = None

    def wait(self, w: PendingWrite, timeout_s: float, poll_s: float = 0.0005) -> None:
        """Block until the WRITE completes; TransferError on failure or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.poll(w)
            if state is WriteState.DONE:
                return
            if state is WriteState.ERR:
                raise TransferError(f"WRITE of {w.nbytes} B to {w.peer} failed")
            if time.monotonic() > deadline:
                self.release(w)
                raise TransferError(f"WRITE of {w.nbytes} B to {w.peer} timed out "
                                    f"after {timeout_s:.1f} s")
            time.sleep(poll_s)

    # either side -----------------------------------------------------------------------------
    def send_notif(self, peer: str, msg: bytes) -> None:
        self._agent.send_notif(peer, msg)

    def take_notifs(self) -> list[tuple[str, bytes]]:
        """Every notification received since the last call, as (peer name, message)."""
        new = self._agent.get_new_notifs()
        out = []
        for peer, msgs in new.items():
            name = peer.decode() if isinstance(peer, bytes) else str(peer)
            out.extend((name, bytes(m)) for m in msgs)
        return out

    def close(self) -> None:
        for peer in list(self._peers):
            with contextlib.suppress(Exception):  # the peer may be gone: nothing to undo
                self.remove_peer(peer)
        if self._reg is not None:
            self._agent.deregister_memory(self._reg)
            self._reg = None
