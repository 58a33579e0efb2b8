"""Process groups over torch.distributed and a launcher that starts N ranks from Python.

A ``ParallelLayout`` names how many ranks share each kind of work:
- ``cp``: context parallel, the tokens of a prefill step are dealt out round-robin (``cp.py``);
- ``tp``: tensor parallel, a layer's heads are split (KDA under CP);
- ``ep``: expert parallel, the routed experts are split (``ep_moe.py``).
Groups are contiguous blocks of ranks of that size, so with ``cp = tp = ep = world`` all three are
the one world group (the reference deployment's TP4/CP4 prefill on four GPUs).

``launch(fn, n)`` spawns ``n`` processes, joins them into one process group over TCP on the
loopback (gloo on CPU, NCCL with one GPU per rank), runs ``fn(*args)`` on every rank and returns
each rank's result. Model code never sees any of this: it stays single-device, and parallelism
is applied to a model as a transformation (``cp.CPPrefill``).
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

Backend = Literal["gloo", "nccl"]


@dataclass(frozen=True)
class ParallelLayout:
    cp: int = 1
    tp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        if min(self.cp, self.tp, self.ep) < 1:
            raise ValueError(f"parallel sizes must be positive: {self}")

    def check(self, world_size: int) -> None:
        for name in ("cp", "tp", "ep"):
            size = getattr(self, name)
            if world_size % size:
                raise ValueError(f"{name}={size} does not divide the world size {world_size}")


@dataclass(frozen=True)
class ParallelInfo:
    """This rank's position in each group (rank r of a size-s group: r = global rank % s)."""

    rank: int
    world_size: int
    cp_size: int = 1
    cp_rank: int = 0
    tp_size: int = 1
    tp_rank: int = 0
    ep_size: int = 1
    ep_rank: int = 0


@dataclass(frozen=True)
class ProcessGroups:
    """The groups of one rank; a group of size 1 is ``None`` (no communication needed)."""

    info: ParallelInfo
    cp: Any = None
    tp: Any = None
    ep: Any = None

    @classmethod
    def single(cls) -> ProcessGroups:
        """One process, no torch.distributed: every size is 1."""
        return cls(ParallelInfo(rank=0, world_size=1))

    @classmethod
    def build(cls, layout: ParallelLayout) -> ProcessGroups:
        """Create the groups of ``layout`` (collective: every rank must call it, in step)."""
        rank, world = dist.get_rank(), dist.get_world_size()
        layout.check(world)
        made: dict[tuple[int, ...], Any] = {}
        groups, info = {}, {"rank": rank, "world_size": world}
        for name in ("cp", "tp", "ep"):
            size = getattr(layout, name)
            groups[name] = _block_group(size, rank, world, made)
            info[f"{name}_size"], info[f"{name}_rank"] = size, rank % size
        return cls(ParallelInfo(**info), **groups)


def _block_group(size: int, rank: int, world: int, made: dict):
    """The group of ``size`` consecutive ranks holding ``rank``; equal blocks share one object."""
    if size == 1:
        return None
    if size == world:
        return dist.group.WORLD
    mine = None
    for start in range(0, world, size):  # new_group is collective: create every block
        ranks = tuple(range(start, start + size))
        if ranks not in made:
            made[ranks] = dist.new_group(list(ranks))
        if start <= rank < start + size:
            mine = made[ranks]
    return mine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(fn: Callable[..., Any], world_size: int, *args: Any,
           backend: Backend = "gloo") -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` spawned ranks joined into one process group.

    ``fn`` must be importable (a module-level function). With ``backend="nccl"`` rank r uses
    GPU r. Returns the ranks' return values in rank order (passed back through ``torch.save``);
    an exception on any rank is raised here with that rank's traceback.
    """
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"nccl with {world_size} ranks needs {world_size} GPUs, "
                         f"found {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory(prefix="glmlab-launch-") as tmp:
        mp.start_processes(_rank_main, args=(fn, world_size, backend, free_port(), tmp, args),
                           nprocs=world_size, join=True, start_method="spawn")
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False)
                for r in range(world_size)]


def _rank_main(rank: int, fn, world_size: int, backend: Backend, port: int, out_dir: str,
               args: tuple) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        result = fn(*args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
