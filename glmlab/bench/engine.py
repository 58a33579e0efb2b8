"""Offline engine throughput (and KV-format agreement), seeded, written as JSONL to data/bench/.

    python -m glmlab.bench.engine --preset tiny --num-prompts 64 --input-len 128 --output-len 32
    python -m glmlab.bench.engine --preset slice:4 --fp8 --device cuda --num-prompts 64 \\
        --input-len 1024 --output-len 64 --kv-dtype fp8 --index-dtype fp8 --dtype bf16
    python -m glmlab.bench.engine --preset tiny --agreement      # FP8 vs BF16 KV, greedy
    python -m glmlab.bench.engine --preset tiny --slots --num-prompts 8 --shared-prefix-len 1024

Throughput: all prompts are queued at once (the offline setting, as ``LLM.generate``) after a
short warm-up; input, output and total tokens/s over the wall time, steps, mean batch sizes,
prefix-cache hit rate, peak KV pages. Prompts come from ``glmlab.bench.workloads`` (random, or
generated-shared-prefix with ``--num-groups``), as token ids. A preset checkpoint is written once
(on ``--device``, so a real-width slice is drawn on the GPU) into the glmlab cache directory.

Agreement: greedy outputs with FP8 KV against BF16 KV on the same fp32 model, free-running
(identical outputs, matched prefix) and teacher-forced (top-1 under the reference tokens).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from glmlab import presets
from glmlab.bench.ops import write_rows
from glmlab.bench.workloads import random_requests, shared_prefix_requests
from glmlab.cache.hybrid import CacheStats
from glmlab.cache.storage import CacheDtypes
from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.presets_dir import preset_tag
from glmlab.checkpoint.writer import write_random_checkpoint
from glmlab.cliargs import add_dataclass_args, dataclass_from_args
from glmlab.core import SamplingParams
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
from glmlab.engine.local_pd import slot_accounting
from glmlab.env import cache_dir
from glmlab.model.backends import Backends
from glmlab.model.session import Session
from glmlab.testing.parity import prompt_ids
from glmlab.tokenizer import Tokenizer
from glmlab.trace.tracer import RecordingTracer

_ENGINE_EXCLUDE = ("device", "dtype", "seed", "speculative")


def checkpoint(args) -> Path:
    if args.model:
        return Path(args.model)
    tag = preset_tag(args.preset, 0, args.fp8)
    out = cache_dir() / "checkpoints" / tag
    if not (out / "config.json").is_file():
        print(f"writing {args.preset} checkpoint to {out} on {args.device}", file=sys.stderr)
        write_random_checkpoint(presets.preset(args.preset), out, seed=0, fp8=args.fp8,
                                device=args.device)
    return out


def _preset(args) -> str | None:
    return None if args.model else args.preset  # a given checkpoint is whatever it is


def workload(tok: Tokenizer, args, n: int, seed: int) -> list[tuple[list[int], int]]:
    if args.num_groups:
        reqs = shared_prefix_requests(tok, args.num_groups, max(1, n // args.num_groups),
                                      args.shared_prefix_len, args.input_len, args.output_len,
                                      args.range_ratio, seed, as_ids=True)
    else:
        reqs = random_requests(tok, n, args.input_len, args.output_len, args.range_ratio, seed,
                               as_ids=True)
    return [(list(r.input_ids), r.output_len) for r in reqs]


def run_batch(engine: Engine, tracer: RecordingTracer, reqs: list[tuple[list[int], int]]) -> dict:
    """Queue everything, step until done; wall time, and what the steps looked like (from the
    engine's trace)."""
    sync = torch.cuda.synchronize if engine.cache.storage.device.type == "cuda" else lambda: None
    tracer.events.clear()
    sync()
    start = time.perf_counter()
    rids = [engine.add_request(ids, SamplingParams(max_new_tokens=m, ignore_eos=True))
            for ids, m in reqs]
    while engine.has_work:
        engine.step()
    sync()
    wall = time.perf_counter() - start
    done = [engine.request(r) for r in rids]
    steps = tracer.steps
    n_in, n_out = sum(r.num_prompt for r in done), sum(len(r.output_ids) for r in done)
    decoding = [s.decode_tokens for s in steps if s.decode_tokens]
    return dict(wall_s=wall, steps=len(steps), input_tokens=n_in, output_tokens=n_out,
                input_tok_s=n_in / wall, output_tok_s=n_out / wall,
                total_tok_s=(n_in + n_out) / wall,
                mean_decode_batch=sum(decoding) / max(1, len(decoding)),
                mean_step_ms=sum(s.duration_ms for s in steps) / max(1, len(steps)),
                cached_tokens=sum(r.cached_tokens for r in done),
                preemptions=sum(r.num_preemptions for r in done),
                peak_pages=max((s.pool.pages_total - s.pool.pages_free for s in steps), default=0))


def throughput(args, cfg: EngineConfig) -> dict:
    path = checkpoint(args)
    tracer = RecordingTracer()
    engine = Engine.from_pretrained(path, cfg, tracer)
    tok, dtype = engine.tokenizer, cfg.model_dtype
    run_batch(engine, tracer, workload(tok, args, args.warmup, args.seed + 1))  # warm caches
    engine.cache.stats = CacheStats()
    result = run_batch(engine, tracer, workload(tok, args, args.num_prompts, args.seed))
    if args.trace:
        tracer.write_chrome_trace(args.trace)
    if args.device.startswith("cuda"):
        result["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return dict(bench="engine", model=str(path), preset=_preset(args), device=args.device,
                model_dtype=str(dtype).removeprefix("torch."), num_prompts=args.num_prompts,
                input_len=args.input_len, output_len=args.output_len,
                shared_prefix_len=args.shared_prefix_len, num_groups=args.num_groups,
                range_ratio=args.range_ratio, seed=args.seed, engine=cfg.describe(),
                cpu_threads=torch.get_num_threads(),
                max_running_requests=engine.budget.max_running_requests,
                num_pages=engine.budget.num_pages, hit_rate=engine.cache.stats.hit_rate, **result)


def kv_agreement(model, prompts: list[list[int]], max_new_tokens: int,
                 test: CacheDtypes, ref: CacheDtypes) -> dict:
    """Greedy outputs with cache formats ``test`` vs ``ref`` on the same model."""
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
    same, prefix, forced, total = 0, 0.0, 0, 0
    for p in prompts:
        n = len(p) + max_new_tokens
        a = Session(model, max_len=n, dtypes=ref).generate(0, p, params)
        b = Session(model, max_len=n, dtypes=test).generate(0, p, params)
        same += a == b
        prefix += next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y),
                       len(a)) / len(a)
        logits = Session(model, max_len=n, dtypes=test).logits({0: p + a[:-1]})[0]
        forced += int((logits[len(p) - 1:].argmax(-1) == torch.tensor(a)).sum())
        total += len(a)
    k = len(prompts)
    return dict(prompts=k, new_tokens=max_new_tokens, identical_outputs=same / k,
                matched_prefix=prefix / k, teacher_forced_top1=forced / total)


def agreement(args) -> dict:
    path = checkpoint(args)
    model = load_model(path, dtype=torch.float32, device=args.device)
    tok = Tokenizer.from_dir(path)
    prompts = [ids for ids, _ in workload(tok, args, args.num_prompts, args.seed)]
    kv = {d: CacheDtypes(latent=d, pool_keys=d, conv=torch.float32, tail=torch.float32)
          for d in (torch.float8_e4m3fn, torch.bfloat16, torch.float32)}
    fp8 = kv_agreement(model, prompts, args.output_len, kv[torch.float8_e4m3fn],
                       kv[torch.bfloat16])
    # for scale: what BF16 KV itself changes against the fp32 reference cache
    bf16 = kv_agreement(model, prompts, args.output_len, kv[torch.bfloat16], kv[torch.float32])
    return dict(bench="engine-kv-agreement", model=str(path), preset=_preset(args),
                test="fp8 latent + fp8 keys", ref="bf16 latent + bf16 keys", model_dtype="fp32",
                input_len=args.input_len, seed=args.seed, **fp8,
                bf16_vs_fp32={k: v for k, v in bf16.items() if k not in ("prompts", "new_tokens")})


def slots(args) -> dict:
    """Token slots of N imported requests sharing a prefix, with and without the kv_only cache."""
    path = checkpoint(args)
    model = load_model(path, dtype=torch.float32, device=args.device)
    prefix = prompt_ids(args.shared_prefix_len, args.seed)
    suffixes = [prompt_ids(args.input_len, args.seed + 1 + i) for i in range(args.num_prompts)]
    acct = slot_accounting(model, prefix, suffixes, context_len=args.context_len or 4096)
    return dict(bench="engine-slots", model=str(path), preset=_preset(args), **asdict(acct),
                expected_shared=acct.expected_shared, expected_unshared=acct.expected_unshared)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--model", help="checkpoint directory (overrides --preset)")
    p.add_argument("--fp8", action="store_true", help="write the preset with FP8 weights")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp32"))
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--range-ratio", type=float, default=1.0)
    p.add_argument("--num-groups", type=int, default=0, help="shared-prefix groups (0: random)")
    p.add_argument("--shared-prefix-len", type=int, default=0)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu-threads", type=int, default=0, help="torch intra-op threads (0: default)")
    p.add_argument("--agreement", action="store_true", help="FP8 vs BF16 KV greedy agreement")
    p.add_argument("--slots", action="store_true",
                   help="Lp + N x Ls: token slots of --num-prompts imported requests sharing "
                        "--shared-prefix-len tokens, each with --input-len of its own")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace of the timed run here")
    p.add_argument("--out", default="data/bench")
    p.add_argument("--tag", default="")
    add_dataclass_args(p, EngineConfig, exclude=_ENGINE_EXCLUDE, defaults={"print_budget": True})
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cpu_threads:
        torch.set_num_threads(args.cpu_threads)
    engine = {f: getattr(args, f) for f in EngineConfig.__dataclass_fields__
              if f not in _ENGINE_EXCLUDE and hasattr(args, f)}
    engine["backends"] = dataclass_from_args(Backends, args, prefix="backends-")
    cfg = EngineConfig(device=args.device, dtype=args.dtype, seed=args.seed, **engine)
    mode = "kv-agreement" if args.agreement else "slots" if args.slots else ""
    row = {"kv-agreement": agreement, "slots": slots}[mode](args) if mode else throughput(args, cfg)
    name = "engine" + (f"-{mode}" if mode else "") + (f"-{args.tag}" if args.tag else "")
    path = write_rows([row], Path(args.out), name, warmup=f"{args.warmup} requests",
                      repetitions=1)
    keys = {"kv-agreement": ("identical_outputs", "matched_prefix", "teacher_forced_top1"),
            "slots": ("token_slots_shared", "expected_shared", "token_slots_unshared",
                      "expected_unshared", "hit_rate"),
            "": ("wall_s", "steps", "input_tok_s", "output_tok_s", "total_tok_s", "hit_rate")}[mode]
    print({k: round(row[k], 4) if isinstance(row[k], float) else row[k] for k in keys})
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
