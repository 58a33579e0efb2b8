"""Model-level timings: prefill and batched decode of a checkpoint through ``Session``.

Measures the forward pass alone (no scheduler) for each backend choice, and checks on the way that
the fast backends agree with the torch references on the same prompt. Rows go to
``data/bench/model.jsonl`` via ``glmlab.bench.ops``.

    python -m glmlab.bench.ops --op model --model DIR --device cuda --backends torch,fla
"""

from __future__ import annotations

import argparse
import time

import torch

from glmlab.checkpoint.presets_dir import resolve_model
from glmlab.engine.config import EngineConfig
from glmlab.engine.model_runner import load_model_for
from glmlab.model.backends import Backends
from glmlab.model.session import Session
from glmlab.testing.parity import prompt_ids

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
TIMING = {"warmup": "one 8-token prefill", "repetitions": "prefill 1, decode --decode-steps"}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str) -> tuple[object, float]:
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return out, (time.perf_counter() - t) * 1e3


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmlab.bench.model")
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    p.add_argument("--backends", default="torch", help="comma list of KDA backends: torch,fla")
    p.add_argument("--prefill-lens", default="256,1024")
    p.add_argument("--decode-batches", default="1,8")
    p.add_argument("--decode-steps", type=int, default=4)
    return p.parse_args(argv)


def run(argv: list[str]) -> list[dict]:
    args = _parse(argv)
    path = resolve_model(args.model)
    model = load_model_for(path, EngineConfig(device=args.device, dtype=args.dtype))
    lens = [int(x) for x in args.prefill_lens.split(",")]
    batches = [int(x) for x in args.decode_batches.split(",")]
    rows, reference = [], {}
    for kda in args.backends.split(","):
        model.use_backends(Backends(kda=kda))
        base = {
            "model": str(path),
            "dtype": args.dtype,
            "device": args.device,
            "backends": model.backends.describe(),
        }
        for n in lens:
            ids = prompt_ids(n, 0, vocab=256)
            session = Session(model, max_len=n + 8)
            session.logits({0: ids[:8]})  # warm-up (kernel compilation, autotuning)
            session = Session(model, max_len=n + 8)
            logits, ms = _timed(lambda s=session, ids=ids: s.logits({0: ids})[0], args.device)
            last = logits[-1].float().cpu()
            ref = reference.setdefault(n, last)
            rows.append(
                {
                    **base,
                    "phase": "prefill",
                    "tokens": n,
                    "ms": ms,
                    "tok_per_s": n / ms * 1e3,
                    "rel_diff_vs_first_backend": float((last - ref).norm() / ref.norm()),
                }
            )
        for b in batches:
            session = Session(model, num_seqs=b, max_len=64 + args.decode_steps + 1)
            session.logits({i: prompt_ids(64, i) for i in range(b)})
            times = []
            for _ in range(args.decode_steps):
                step = {i: [1] for i in range(b)}
                _, ms = _timed(lambda s=session, step=step: s.logits(step), args.device)
                times.append(ms)
            ms = sorted(times)[len(times) // 2]
            rows.append(
                {
                    **base,
                    "phase": "decode",
                    "batch": b,
                    "context": 64,
                    "ms": ms,
                    "tok_per_s": b / ms * 1e3,
                }
            )
    for r in rows:
        print(r)
    return rows
