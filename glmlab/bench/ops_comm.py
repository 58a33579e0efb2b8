"""Collective benchmark (``python -m glmlab.bench.ops --op comm``): NCCL times for ``CommTable``.

    python -m glmlab.bench.ops --op comm --tag h200x2 --ranks 2 --graph
    (rows -> data/bench/comm-h200x2.jsonl)

Every rank joins one NCCL group (``parallel.launch``); for each collective (all-reduce,
all-gather, reduce-scatter) and size (bytes as nccl-tests counts them, bf16 tensors) the ranks run
``--warmup`` calls, then ``--reps`` calls timed with CUDA events, eagerly and, with ``--graph``,
as ``--reps`` calls captured in one CUDA graph and replayed (how a decode step issues them). Rank
0's median per call is the row (``kind, ranks, bytes, time_us, graph``; the ops runner stamps
it); ``glmlab.distributed.comm_table.CommTable.from_file`` reads the eager rows back over the
published curves. ``--backend gloo``
runs the same code on CPU processes (a rehearsal of the script, not a measurement of NVLink).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from glmlab.distributed.comm_table import bus_factor
from glmlab.distributed.interleave import _all_gather, _reduce_scatter
from glmlab.distributed.parallel import launch

KINDS = ("all_reduce", "all_gather", "reduce_scatter")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmlab.bench.ops --op comm")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--min-bytes", type=int, default=2**12)
    p.add_argument("--max-bytes", type=int, default=2**30)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--graph", action="store_true", help="also time calls replayed from a graph")
    return p.parse_args(argv)


def _op(kind: str, size: int, ranks: int, device: str):
    """A closure issuing one ``kind`` call of ``size`` bytes (bf16), and its buffers."""
    n = max(ranks, size // 2 // ranks * ranks)  # elements of the counted buffer
    if kind == "all_reduce":
        x = torch.ones(n, dtype=torch.bfloat16, device=device)
        return lambda: dist.all_reduce(x)
    if kind == "all_gather":
        out = torch.empty(n, dtype=torch.bfloat16, device=device)
        x = torch.ones(n // ranks, dtype=torch.bfloat16, device=device)
        return lambda: _all_gather(out, x)
    x = torch.ones(n, dtype=torch.bfloat16, device=device)
    out = torch.empty(n // ranks, dtype=torch.bfloat16, device=device)
    return lambda: _reduce_scatter(out, x)


def _time_us(fn, reps: int, warmup: int, cuda: bool) -> float:
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    times = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def _graph_us(fn, reps: int) -> float:
    """Per call, ``reps`` calls captured in one CUDA graph, replayed 3 times (median)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    out = []
    for _ in range(3):
        dist.barrier()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(out)


def _rank_main(args: argparse.Namespace) -> list[dict]:
    cuda = dist.get_backend() == "nccl"
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    ranks, rows = dist.get_world_size(), []
    size = args.min_bytes
    while size <= args.max_bytes:
        for kind in KINDS:
            fn = _op(kind, size, ranks, device)
            rows.append({"kind": kind, "ranks": ranks, "bytes": size, "graph": False,
                         "time_us": round(_time_us(fn, args.reps, args.warmup, cuda), 3)})
            if args.graph and cuda:
                rows.append({"kind": kind, "ranks": ranks, "bytes": size, "graph": True,
                             "time_us": round(_graph_us(fn, args.reps), 3)})
        size *= 2
    return rows


def run(argv: list[str] | None = None) -> list[dict]:
    args = _args(argv)
    rows = launch(_rank_main, args.ranks, args, backend=args.backend)[0]
    for r in rows:
        r.update(backend=args.backend, dtype="bfloat16", bus_gbs=round(_busbw(r), 2))
        print(f"{r['kind']:15} x{r['ranks']} {r['bytes']:>11,} B graph={r['graph']!s:5} "
              f"{r['time_us']:10.2f} us  busbw {r['bus_gbs']:7.1f} GB/s", flush=True)
    return rows


def _busbw(row: dict) -> float:
    return row["bytes"] * bus_factor(row["kind"], row["ranks"]) / (row["time_us"] * 1e3)


TIMING = {"warmup": "--warmup calls (default 5)",
          "repetitions": "--reps calls (default 20), median"}
