"""Rank r of a TP / EP / CP layout on one device: a process group that communicates nothing.

``StandInGroup`` is a ``torch.distributed.ProcessGroup`` (a Python subclass, so ``dist.all_reduce``
and the other collectives accept it without ``init_process_group``) that plays rank ``rank`` of a
group of ``size`` ranks. Every collective returns at once and writes only what this rank could
know by itself:

- ``all_reduce``: the tensor is left as it is: a partial sum stays partial;
- ``all_gather``: every rank's block of the output is this rank's input (so shapes, and values of
  the right magnitude, flow on: routing, norms and kernels see realistic inputs);
- ``reduce_scatter``: this rank's block of the input, unreduced;
- ``broadcast`` / ``barrier``: nothing.

Each call is appended to a ``CollectiveRecorder`` as a ``Collective`` (kind, bytes as nccl-tests
counts them, ranks, dtype, the recorder's current phase), so a step's communication can be priced
afterwards (``comm_model``). The outputs of a model run this way are **not** the model's: they are
rank r's compute on stand-in inputs. Its timings are rank r's compute (plus the device copies the
stand-in all-gather / reduce-scatter make, which a real NCCL call would make over NVLink instead).

Calls made while a CUDA graph replays are not seen (nothing runs on the host): record a step
eagerly, or at capture, to know what a replay communicates.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.futures import Future

from glmlab.distributed.parallel import ParallelInfo, ParallelLayout, ProcessGroups

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier")


@dataclass(frozen=True)
class Collective:
    kind: str  # one of KINDS
    bytes: int  # nccl-tests' "size": all_reduce the buffer, all_gather the output,
    #             reduce_scatter the input (every rank's share), broadcast the buffer
    ranks: int
    dtype: str
    phase: str  # the recorder's phase when the call was made ("" outside any)


class CollectiveRecorder:
    """The collectives a stand-in rank issued, in order, each tagged with the current phase."""

    def __init__(self) -> None:
        self.calls: list[Collective] = []
        self.phase = ""
        self.enabled = True

    @contextlib.contextmanager
    def scope(self, phase: str):
        """Tag the calls made inside with ``phase`` (nested scopes: the innermost wins)."""
        before, self.phase = self.phase, phase
        try:
            yield self
        finally:
            self.phase = before

    @contextlib.contextmanager
    def paused(self):
        """Calls made inside are not recorded (graph warm-ups, timing loops)."""
        before, self.enabled = self.enabled, False
        try:
            yield self
        finally:
            self.enabled = before

    def add(self, kind: str, nbytes: int, ranks: int, dtype: torch.dtype) -> None:
        if self.enabled:
            self.calls.append(Collective(kind, int(nbytes), ranks, str(dtype).replace("torch.", ""),
                                         self.phase))

    def clear(self) -> None:
        self.calls.clear()

    def take(self) -> list[Collective]:
        """The calls so far, and forget them."""
        out, self.calls = self.calls, []
        return out

    @staticmethod
    def summary(calls: list[Collective]) -> dict[str, dict]:
        """kind -> {count, bytes} (every phase together)."""
        count, size = Counter(), Counter()
        for c in calls:
            count[c.kind] += 1
            size[c.kind] += c.bytes
        return {k: {"count": count[k], "bytes": size[k]} for k in count}


def _done(result=None) -> dist.Work:
    return _Done(result)


class _Done(dist._Work if hasattr(dist, "_Work") else dist.Work):  # completed at once
    def __init__(self, result=None):
        super().__init__()
        self._result = result

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> Future:
        fut: Future = Future()
        fut.set_result(self._result)
        return fut


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class StandInGroup(dist.ProcessGroup):
    """Rank ``rank`` of a ``size``-rank group, alone on its device (see the module docstring)."""

    def __init__(self, rank: int, size: int, recorder: CollectiveRecorder):
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} outside a group of {size}")
        super().__init__(rank, size)
        self._rank, self._size, self.recorder = rank, size, recorder

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "standin"

    def __repr__(self) -> str:
        return f"StandInGroup(rank={self._rank}, size={self._size})"

    # ------------------------------------------------------------------ collectives
    def allreduce(self, tensors, opts=None):
        for t in tensors:  # partial sums stay partial
            self.recorder.add("all_reduce", _nbytes(t), self._size, t.dtype)
        return _done(tensors)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 (torch's names)
        self.recorder.add("all_gather", _nbytes(output), self._size, output.dtype)
        output.view(self._size, *input.shape).copy_(input.unsqueeze(0).expand(self._size,
                                                                              *input.shape))
        return _done([output])

    _allgather_base = all_gather_single  # torch <= 2.12 calls it by this name

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        self.recorder.add("reduce_scatter", _nbytes(input), self._size, input.dtype)
        output.copy_(input.view(self._size, *output.shape)[self._rank])
        return _done([output])

    _reduce_scatter_base = reduce_scatter_single

    def broadcast(self, tensors, opts=None):
        for t in tensors:
            self.recorder.add("broadcast", _nbytes(t), self._size, t.dtype)
        return _done(tensors)

    def barrier(self, opts=None):
        self.recorder.add("barrier", 0, self._size, torch.uint8)
        return _done()


def emulated_groups(layout: ParallelLayout, rank: int,
                    recorder: CollectiveRecorder) -> ProcessGroups:
    """Rank ``rank`` of ``layout`` (world = the largest group) with stand-in groups: what
    ``ProcessGroups.build`` would give that rank, without other processes. Groups of equal size
    are one object, as ``build`` makes them when every group spans the world."""
    world = max(layout.cp, layout.tp, layout.ep)
    layout.check(world)
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside a world of {world}")
    made: dict[int, StandInGroup] = {}
    groups, info = {}, {"rank": rank, "world_size": world}
    for name in ("cp", "tp", "ep"):
        size = getattr(layout, name)
        if size > 1 and size not in made:
            made[size] = StandInGroup(rank % size, size, recorder)
        groups[name] = made.get(size) if size > 1 else None
        info[f"{name}_size"], info[f"{name}_rank"] = size, rank % size
    return ProcessGroups(ParallelInfo(**info), **groups)
