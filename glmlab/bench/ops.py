"""Kernel benchmarks: one registry of ops and shapes, one runner, results as JSONL in data/bench/.

An op family registers ``name -> fn(args) -> list[dict]`` (each dict one measured case: shape,
variant, microseconds, TFLOP/s, GB/s, ratio to the baseline measured in the same run). The runner
stamps every row with its provenance (``glmlab.bench.provenance``: commit, command line, versions,
GPU and clocks, warm-up and repetitions) and appends the rows to ``data/bench/<name>.jsonl``. A
family module may say how it times with ``TIMING = {"warmup": ..., "repetitions": ...}``.

    python -m glmlab.bench.ops --op moe --out data/bench
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

from glmlab.bench.provenance import stamp

# op name -> "module:function"; each function takes the parsed argparse namespace.
OPS: dict[str, str] = {
    "model": "glmlab.bench.model:run",
}
OPS["moe"] = "glmlab.bench.ops_moe:run"
OPS["cp"] = "glmlab.bench.ops_cp:run"
OPS["dsa"] = "glmlab.bench.ops_dsa:run"
OPS["decode"] = "glmlab.bench.ops_decode:run"
OPS["kda-window"] = "glmlab.bench.ops_kda_window:run"
OPS["comm"] = "glmlab.bench.ops_comm:run"
OPS["reference_point"] = "glmlab.bench.reference_point:run"
OPS["api"] = "glmlab.bench.api:run"


def register(name: str, target: str) -> None:
    OPS[name] = target


def machine(warmup: int | str | None = None, repetitions: int | str | None = None) -> dict:
    """The provenance every row carries (``glmlab.bench.provenance.stamp``)."""
    return stamp(warmup, repetitions)


def bench_us(fn: Callable[[], object], warmup: int = 5, rep: int = 20) -> float:
    """Median wall time of ``fn`` in microseconds (CUDA events on GPU, perf_counter on CPU)."""
    if torch.cuda.is_available():
        import triton.testing

        return (
            float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")) * 1e3
        )
    import time

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rep):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e6


def write_rows(rows: list[dict], out: Path, name: str, warmup: int | str | None = None,
               repetitions: int | str | None = None) -> Path:
    """Append ``rows`` to ``out/<name>.jsonl``, each stamped with its provenance (commit, command,
    versions, GPU and clocks, the caller's warm-up / repetition counts); a row's own field wins."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.jsonl"
    meta = machine(warmup, repetitions)
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps({**meta, **row}) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--op", required=True, help=f"one of: {', '.join(sorted(OPS)) or '(none)'}")
    parser.add_argument("--out", default="data/bench")
    parser.add_argument("--tag", default="", help="suffix for the output file name")
    args, rest = parser.parse_known_args(argv)
    if args.op not in OPS:
        parser.error(f"unknown op {args.op!r}; registered: {sorted(OPS)}")
    module, _, fn = OPS[args.op].partition(":")
    family = importlib.import_module(module)
    rows = getattr(family, fn)(rest)
    timing = getattr(family, "TIMING", {})  # {"warmup": ..., "repetitions": ...} of the family
    path = write_rows(rows, Path(args.out), args.op + (f"-{args.tag}" if args.tag else ""),
                      **timing)
    print(f"{len(rows)} rows -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
