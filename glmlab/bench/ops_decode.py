"""Decode / verify step benchmark (``python -m glmlab.bench.ops --op decode``): before vs new.

Real-width ``slice:N`` models with random block-FP8 weights drawn in place on the GPU
(``glmlab.distributed.random_shard``, nothing written to disk), a cache filled with random rows
at the given context (no prefill: a step's cost depends on how much it reads, not on the values),
and one step of ``width`` tokens per request (1: decode; 8: a speculative verify window, with a
REPLAY state recorder) for each batch. Two paths on the same model and cache, side by side:

- ``before``: the backends the issue measured (fla / tilelang / triton MoE), every other op on its
  torch reference (FP8 weights dequantised per call, mHC as small ops, per-sequence indexer), eager;
- ``new``: ``Backends.fast()`` (block-FP8 GEMM, fused mHC / norm / router, fused KDA prep + in-place
  window, paged indexer) replayed from a CUDA graph of the step's batch bucket.

Each row: ``step_ms`` (wall per step, steps back to back), ``kernels_per_layer`` and
``gpu_busy_frac`` (device time of the step's kernels over its wall time, from the profiler;
the kernels of a graph replay are those of the eager fused step), ``host_syncs`` (CUDA syncs torch
reports during a step), and ``roofline_ms``: the bytes the step must read (every weight it uses,
routed experts only where a token went, the embedding rows it looks up; the latent rows and pooled
indexer keys it attends to; the KDA recurrent state read, and written on decode; conv state) over
the HBM bandwidth measured in the same run by a device copy. GPU only.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from glmlab.bench.ops import machine
from glmlab.cache.storage import CacheDtypes, ModelCache
from glmlab.distributed.parallel import ProcessGroups
from glmlab.distributed.random_shard import random_tp_model
from glmlab.engine.cuda_graph import CudaGraphRunner, batch_buckets
from glmlab.model.backends import Backends
from glmlab.model.layers import Linear
from glmlab.model.moe import Experts, Router
from glmlab.model.plan import ForwardPlan, StepPlan
from glmlab.model.session import run_step
from glmlab.presets import preset
from glmlab.speculative.commit import SpecStateStore
from glmlab.speculative.replay import CommitMode
from glmlab.testing.syncs import count_host_syncs

PATHS = {"before": Backends(kda="fla", sparse_mla="tilelang", moe="triton"),
         "new": Backends.fast()}
PAGE = 64


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmlab.bench.ops --op decode")
    p.add_argument("--presets", default="slice:4,slice:8")
    p.add_argument("--batches", default="1,32,128,256")
    p.add_argument("--contexts", default="1024,8192")
    p.add_argument("--verify-batches", default="16,132")
    p.add_argument("--verify-width", type=int, default=8)
    p.add_argument("--verify-context", type=int, default=1024)
    p.add_argument("--paths", default="before,new")
    p.add_argument("--reps", type=int, default=20, help="timed steps of the new path")
    p.add_argument("--before-reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--state-dtype", choices=("fp32", "bf16"), default="fp32",
                   help="KDA recurrent state (the reference deployment: bf16)")
    p.add_argument("--stream", help="append each row to this JSONL file as it is measured")
    p.add_argument("--time-budget", type=float, help="seconds; later cases are skipped")
    return p.parse_args(argv)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def ceilings(device) -> dict[str, float]:
    """Measured now: HBM bytes/s of a device copy (read + write) and the FP8 ``_scaled_mm`` rate
    (``kernels.moe.timing.measure_ceilings``), and the FLOP/s of an 8192^3 bf16 matmul."""
    import triton.testing

    from glmlab.kernels.moe.timing import measure_ceilings

    moe = measure_ceilings()
    n = 8192
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    ms = float(triton.testing.do_bench(lambda: a @ b, warmup=10, rep=50, return_mode="median"))
    return {"hbm": moe["hbm_copy_tbs"] * 1e12, "bf16": 2 * n**3 / (ms * 1e-3),
            "fp8": moe["fp8_scaled_mm_tflops"] * 1e12}


# ---------------------------------------------------------------- model, cache, plans
def build_model(name: str, seed: int):
    groups = ProcessGroups.single()
    model = random_tp_model(preset(name), groups, seed=seed, fp8=True, fp8_mode="keep",
                            dtype=torch.bfloat16, device="cuda", with_mtp=False)
    return model


def build_cache(model, batch: int, context: int, device: str = "cuda",
                state_dtype: torch.dtype = torch.float32) -> ModelCache:
    """Room for ``batch`` requests of ``context`` tokens plus a window, request i at slot i + 1
    and pages from (i + 1) * pages_per_seq (slot 0 and the first pages are padding scratch).
    The KDA state in ``state_dtype`` (the reference deployment keeps it in bf16)."""
    pages = -(-(context + 16) // PAGE)  # per request; the cache holds batch + 2 of them
    dtypes = replace(CacheDtypes.like(model.dtype), recurrent=state_dtype)
    cache = ModelCache(model.cfg, (batch + 2) * pages * PAGE, batch + 2, PAGE, dtypes, device,
                       with_mtp=False)
    with torch.no_grad():
        for t in cache.regions().values():
            if t[0].is_floating_point():
                t[0].normal_().mul_(0.1)
    return cache


def step_plan(cache: ModelCache, batch: int, context: int, width: int, recorder, vocab: int
              ) -> StepPlan:
    """Requests 1..batch (slots and page runs as ``build_cache`` lays them out), each at
    ``context`` cached tokens, bringing ``width`` new ones."""
    per_request = cache.num_pages // (cache.num_state_slots)
    need = -(-(context + width) // PAGE)
    table = torch.stack([torch.arange(need) + (i + 1) * per_request for i in range(batch)])
    plan = ForwardPlan.build([width] * batch, [context] * batch, list(range(1, batch + 1)),
                             table.to(cache.device), PAGE, verify=recorder)
    ids = torch.randint(0, vocab, (batch * width,), device=cache.device)
    return StepPlan(ids, plan)


# ---------------------------------------------------------------- measurements
def wall_ms(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3


def profile(fn) -> tuple[int, float]:
    """(kernels, device ms) of one call."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    dev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    us = sum(getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0) for e in dev)
    kernels = [e for e in dev if "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    return len(kernels), us / 1e3


def roofline(model, cache: ModelCache, plan: StepPlan, hit: dict[int, int],
             ceil: dict[str, float]) -> dict[str, dict]:
    """By part of the step: the bytes it must move (every weight it uses, routed experts only
    where a token went; the latent rows and pooled indexer keys it attends to; the KDA state read,
    and written on decode), the FLOPs it must do (FP8 or bf16 tensor-core work), and its floor:
    the larger of bytes over HBM bandwidth and FLOPs over the measured rate. The step's roofline
    is the sum of the parts' floors (a verify step's lm_head over 1,056 rows is compute-bound
    while its weights are a stream: one global max would hide either)."""
    cfg, f = model.cfg, plan.forward
    n, width, t = f.num_seqs, f.uniform_width, f.num_tokens
    context = f.cache_lens[0]
    weights = experts = fp8_dense = bf16_dense = expert_flops = 0
    for name, p in model.named_parameters():
        if name.startswith("mtp.") or ".experts." in name:
            continue
        weights += (t * p.shape[1] * p.element_size() if "embed_tokens" in name
                    else p.numel() * p.element_size())
    for name, m in model.named_modules():
        if name.startswith("mtp."):
            continue
        if getattr(m, "weight_scale_inv", None) is not None:
            weights += m.weight_scale_inv.numel() * 4
        if isinstance(m, Linear):
            flops = 2 * t * m.in_features * m.out_features
            fp8_dense, bf16_dense = ((fp8_dense + flops, bf16_dense) if m.is_fp8
                                     else (fp8_dense, bf16_dense + flops))
    for i, m in enumerate(x for x in model.modules() if isinstance(x, Experts)):
        per = sum(w[0].numel() * w.element_size() for w in (m.w13, m.w2, m.w13_scale, m.w2_scale)
                  if w is not None)
        experts += hit.get(i, m.w13.shape[0]) * per
        expert_flops += 2 * t * cfg.moe.top_k * (m.w13[0].numel() + m.w2[0].numel())
    d = cfg.dsa
    rows = min(context + width, width * d.max_selected)  # distinct latent rows per request
    dsa_layers = len(cfg.layer_types) - len(cfg.kda_layers)
    kv = n * rows * cache.latent_bytes_per_token()  # every DSA layer
    selected = min(context + width, d.max_selected)  # rows each query attends to
    attn_flops = dsa_layers * 2 * t * d.num_heads * selected * 2 * d.kv_lora_rank
    pools = (context + width) // d.index_kpool
    scored = (context + 1) // d.index_kpool > d.topk_pools  # else every pool is kept unscored
    index = int(n * (context + width) * cache.index_bytes_per_token()) if scored else 0
    index_flops = dsa_layers * 2 * t * d.index_n_heads * d.index_head_dim * pools if scored else 0
    k = cfg.kda
    state_bytes = next(iter(cache.recurrent.values())).element_size()
    state_one = k.num_heads * k.head_dim * k.head_dim * state_bytes
    conv_one = k.conv_channels * (k.conv_kernel - 1) * 2
    state = n * len(cfg.kda_layers) * (state_one * (1 if f.verify is not None else 2)
                                       + 2 * conv_one)
    hbm, bf16, fp8 = ceil["hbm"], ceil["bf16"], ceil["fp8"]
    parts = {"weights": (weights, fp8_dense / fp8 + bf16_dense / bf16, fp8_dense + bf16_dense),
             "experts": (experts, expert_flops / fp8, expert_flops),
             "attention": (kv + index, (attn_flops + index_flops) / bf16,
                           attn_flops + index_flops),
             "state": (state, 0.0, 0)}  # KDA's few FLOPs per state byte run on CUDA cores
    return {name: {"bytes": int(b), "flops": int(fl), "ms": max(b / hbm, sec) * 1e3,
                   "bound": "hbm" if b / hbm >= sec else "compute"}
            for name, (b, sec, fl) in parts.items()}


def experts_hit(model, cache, plan) -> dict[int, int]:
    """Distinct routed experts per MoE layer in this step (an eager pass with hooks)."""
    hit, routers = {}, [m for m in model.modules() if isinstance(m, Router)]
    hooks = [r.register_forward_hook(
        lambda mod, args, out, i=i: hit.__setitem__(i, int(torch.unique(out[1]).numel())))
        for i, r in enumerate(routers)]
    try:
        run_step(model, cache, plan)
    finally:
        for h in hooks:
            h.remove()
    return hit


# ---------------------------------------------------------------- the run
def _cases(args) -> list[tuple[int, int, int]]:
    """(batch, context, width): decode at every batch x context, then the verify steps."""
    out = [(b, c, 1) for c in _ints(args.contexts) for b in _ints(args.batches)]
    return out + [(b, args.verify_context, args.verify_width) for b in _ints(args.verify_batches)]


def _measure(path: str, model, cache, plan, reps: int) -> dict:
    model.use_backends(PATHS[path])
    eager = lambda: run_step(model, cache, plan)  # noqa: E731
    eager()  # compile / warm up
    kernels, device_ms = profile(eager)
    out = {"eager_host_syncs": count_host_syncs(eager)}
    if path == "before":
        out.update(step_ms=wall_ms(eager, reps), host_syncs=out["eager_host_syncs"])
    else:
        f = plan.forward
        bucket = next(b for b in batch_buckets(max(256, f.num_seqs)) if b >= f.num_seqs)
        runner = CudaGraphRunner(model, cache, bucket, f.page_table.shape[1], [bucket])
        runner.capture(f.uniform_width, f.verify)
        replay = lambda: runner.run(plan)  # noqa: E731
        out.update(step_ms=wall_ms(replay, reps), host_syncs=count_host_syncs(replay),
                   bucket=bucket, graph_mb=round(runner.memory_bytes() / 2**20, 1),
                   eager_step_ms=wall_ms(eager, max(2, reps // 4)))
        graph_kernels, graph_ms = profile(replay)
        if graph_kernels:  # the profiler saw the replayed kernels
            kernels, device_ms = graph_kernels, graph_ms
        del runner
        torch.cuda.empty_cache()
    out.update(kernels=kernels, device_ms=device_ms)
    return out


def run(argv: list[str]) -> list[dict]:
    args = _args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the decode benchmark needs a GPU")
    start = time.perf_counter()
    warmup = "one eager step (compiles); graphs: capture + one replay"
    repetitions = (f"new: {args.reps} graph replays back to back, before: {args.before_reps} "
                   f"eager steps; wall clock over them")
    ceil = ceilings("cuda")
    hbm = ceil["hbm"]
    gpu = torch.cuda.get_device_name(0)
    stream = Path(args.stream) if args.stream else None
    rows: list[dict] = []
    for name in args.presets.split(","):
        model = build_model(name, args.seed)
        cfg = model.cfg
        cases = _cases(args)
        for context in sorted({c for _, c, _ in cases}):
            mine = [(b, w) for b, c, w in cases if c == context]
            cache = build_cache(model, max(b for b, _ in mine), context,
                                state_dtype=getattr(torch, {"fp32": "float32",
                                                            "bf16": "bfloat16"}[args.state_dtype]))
            for batch, width in mine:
                if args.time_budget and time.perf_counter() - start > args.time_budget:
                    print(f"time budget spent: skipping {name} b{batch} c{context} w{width}")
                    continue
                recorder = None if width == 1 else SpecStateStore(
                    cfg, batch + 2, width, CommitMode.REPLAY, torch.bfloat16, device="cuda")
                plan = step_plan(cache, batch, context, width, recorder, cfg.vocab_size)
                model.use_backends(PATHS["new"])
                parts = roofline(model, cache, plan, experts_hit(model, cache, plan), ceil)
                roof_ms = sum(p["ms"] for p in parts.values())
                for path in args.paths.split(","):
                    m = _measure(path, model, cache, plan,
                                 args.before_reps if path == "before" else args.reps)
                    row = {"gpu": gpu, "preset": name, "layers": cfg.num_layers, "batch": batch,
                           "state_dtype": args.state_dtype,
                           "context": context, "width": width, "path": path,
                           "step_ms": round(m["step_ms"], 3), "roofline_ms": round(roof_ms, 3),
                           "x_roofline": round(m["step_ms"] / roof_ms, 2),
                           "gpu_busy_frac": round(min(1.0, m["device_ms"] / m["step_ms"]), 3),
                           "kernels_per_layer": round(m["kernels"] / cfg.num_layers, 1),
                           "host_syncs": m["host_syncs"], "hbm_tbs": round(hbm / 1e12, 3),
                           "device_ms": round(m["device_ms"], 3),
                           "bf16_tflops": round(ceil["bf16"] / 1e12, 1),
                           "fp8_tflops": round(ceil["fp8"] / 1e12, 1),
                           "bytes": {k: p["bytes"] for k, p in parts.items()},
                           "flops": {k: p["flops"] for k, p in parts.items()},
                           "roofline_parts_ms": {k: round(p["ms"], 3) for k, p in parts.items()},
                           "bound": {k: p["bound"] for k, p in parts.items()},
                           "backends": PATHS[path].describe(),
                           **{k: m[k] for k in ("eager_host_syncs", "eager_step_ms", "bucket",
                                                 "graph_mb") if k in m}}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    if stream is not None:
                        with stream.open("a") as fh:
                            fh.write(json.dumps({**machine(warmup, repetitions), **row}) + "\n")
            del cache
            torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()
    return rows
