"""Kernel benchmarks: one registry of ops and shapes, one runner, results as JSONL in data/bench/.

An op family registers ``name -> fn(args) -> list[dict]`` (each dict one measured case: shape,
variant, microseconds, TFLOP/s, GB/s, ratio to the baseline measured in the same run). The runner
adds the machine and versions to every row and appends the rows to ``data/bench/<name>.jsonl``.

    python -m glmlab.bench.ops --op moe --out data/bench
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import platform
from collections.abc import Callable
from pathlib import Path

import torch

# op name -> "module:function"; each function takes the parsed argparse namespace.
OPS: dict[str, str] = {
    "model": "glmlab.bench.model:run",
}
OPS["moe"] = "glmlab.bench.ops_moe:run"
OPS["cp"] = "glmlab.bench.ops_cp:run"
OPS["dsa"] = "glmlab.bench.ops_dsa:run"


def register(name: str, target: str) -> None:
    OPS[name] = target


def machine() -> dict:
    info = {
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(
            gpu=p.name,
            sm=f"{p.major}{p.minor}",
            gpu_mem_gb=round(p.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
        )
    return info


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


def write_rows(rows: list[dict], out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.jsonl"
    meta = machine()
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
    rows = getattr(importlib.import_module(module), fn)(rest)
    path = write_rows(rows, Path(args.out), args.op + (f"-{args.tag}" if args.tag else ""))
    print(f"{len(rows)} rows -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
