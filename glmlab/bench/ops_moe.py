"""MoE kernel benchmark (``python -m glmlab.bench.ops --op moe``): tuned vs default vs torch.

GLM-5.3-Flash shapes: D 4096, I 2048, top-8; E = 288 (one rank holds every expert) and E = 72
(rank 0 of EP4: routes over 288 experts, other ranks' pairs dropped). For each M (tokens before
top-k) one route is drawn from routing samples (``--samples``; uniform top-k without them) and
the routed-expert MoE is timed (CUDA graphs, L2 flushed between calls) as:

- ``triton_tuned``: ``fused_moe`` with ``choose_config(M, table)`` from the tuned table;
- ``triton_default``: the same kernels with the untuned default config;
- ``torch_loop``: per expert ``torch._scaled_mm`` (FP8, row-wise scales) + torch SwiGLU/quant;
- ``torch_grouped``: ``torch._scaled_grouped_mm`` (one CUTLASS grouped GEMM per projection).

Each row has microseconds, weight-streaming TB/s and FP8 TFLOP/s and their fractions of the
ceilings measured in the same run (HBM copy bandwidth, ``torch._scaled_mm`` 8192^3 peak).
``act_quant`` rows compare the fused SwiGLU + FP8 quantisation kernel with the unfused pair at
8192 tokens. GPU only.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from glmlab.kernels.fp8.quant_triton import quant_act_fp8_triton
from glmlab.kernels.fp8.ref import FP8, FP8_MAX, dequant_block_fp8
from glmlab.kernels.moe.act_triton import _launch_swiglu, swiglu, swiglu_quant
from glmlab.kernels.moe.configs import (
    CONFIG_DIR,
    DEFAULT_CONFIG,
    MoEShape,
    choose_config,
    read_table,
)
from glmlab.kernels.moe.fused_moe import device_name, fused_moe
from glmlab.kernels.moe.ref import clamped_swiglu, moe_experts_fp8_ref, swiglu_quant_ref
from glmlab.kernels.moe.routing_triton import align_pairs
from glmlab.kernels.moe.samples import RoutingSamples, local_ids, routes_for_m, uniform_routes
from glmlab.kernels.moe.timing import GraphTimer
from glmlab.kernels.moe.tuner import Problem

TOKENS = (1, 16, 64, 128, 256, 768, 1024, 4096, 8192)
TIMING = {"warmup": "1 call + graph capture", "repetitions": "median of 5 graph replays"}
DEFAULT_SAMPLES = Path("data/routing/slice4-layer3.safetensors")


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmlab.bench.ops --op moe")
    p.add_argument("--experts", default="288,72", help="local expert counts (288 = all)")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--configs", default=str(CONFIG_DIR), help="tuned table directory")
    p.add_argument("--samples", default=str(DEFAULT_SAMPLES), help="routing samples")
    p.add_argument("--no-torch", action="store_true", help="skip the torch baselines")
    p.add_argument("--time-budget", type=float, help="seconds; later (E, M) cases are skipped")
    return p.parse_args(argv)


def measure_ceilings() -> dict:
    """HBM bandwidth and the FP8 ``torch._scaled_mm`` rate, measured now (eager, do_bench).

    ``hbm_copy_tbs`` counts a 2 GiB device copy's bytes read + written (docs/platform.md's measure);
    ``hbm_read_tbs`` a 2 GiB reduction's bytes read (what weight streaming is). Not in CUDA
    graphs: a captured D2D copy becomes a copy-engine node, measured here at ~2.8 TB/s.
    """
    import triton.testing

    def us(fn) -> float:
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3

    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    dst = torch.empty_like(src)
    copy_us, read_us = us(lambda: dst.copy_(src)), us(lambda: src.sum(dtype=torch.float32))
    n = 8192
    a = torch.randn(n, n, device="cuda").to(FP8)
    b = torch.randn(n, n, device="cuda").to(FP8)
    one = torch.ones((), device="cuda")
    mm_us = us(lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16))
    nbytes = src.numel() * src.element_size()
    return {"hbm_copy_tbs": 2 * nbytes / copy_us / 1e6, "hbm_read_tbs": nbytes / read_us / 1e6,
            "fp8_scaled_mm_tflops": 2 * n ** 3 / mm_us / 1e6}


def _route(samples: RoutingSamples | None, m: int, e: int, seed: int) -> torch.Tensor:
    if samples is None:
        ids = uniform_routes(288, 8, m, 1, seed)[0]
    else:
        ids = routes_for_m(samples, m, 1, seed)[0]
    return local_ids(ids, 0, e).cuda()


def _quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


def rowwise_weights(p: Problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The experts requantised with one scale per output row (what ``torch._scaled_mm`` takes):
    (w13 [E, 2I, D], s13 [E, 2I], w2, s2), the same matrices up to E4M3 rounding."""
    out = []
    for w, s in ((p.w13, p.w13_scale), (p.w2, p.w2_scale)):
        q = torch.empty_like(w)
        scale = torch.empty(w.shape[:2], dtype=torch.float32, device=w.device)
        for e in range(w.shape[0]):
            q[e], row = _quant_rows(dequant_block_fp8(w[e], s[e], torch.float32, p.shape.block))
            scale[e] = row[:, 0]
        out += [q, scale]
    return tuple(out)


def torch_loop(p: Problem, rw, x, ids, w):
    """Per-expert FP8 ``torch._scaled_mm``; the per-expert row lists are made outside the timing."""
    (w13, s13, w2, s2), inter, groups = rw, p.shape.intermediate, []
    for e in torch.unique(ids[ids >= 0]).tolist():
        tok, slot = torch.where(ids == e)
        groups.append((e, tok, w[tok, slot, None].to(x.dtype)))

    def run():
        out = torch.zeros_like(x)
        for e, tok, wt in groups:
            a, sa = _quant_rows(x[tok])
            h = torch._scaled_mm(a, w13[e].t(), sa, s13[e][None], out_dtype=x.dtype)
            y, sy = _quant_rows(clamped_swiglu(h[:, :inter], h[:, inter:], p.limit))
            o = torch._scaled_mm(y, w2[e].t(), sy, s2[e][None], out_dtype=x.dtype)
            out.index_add_(0, tok, o * wt)
        return out
    return run


def torch_grouped(p: Problem, rw, x, ids, w):
    """``torch._scaled_grouped_mm`` over rows sorted by expert, each expert padded to 16 rows."""
    align = align_pairs(ids, p.shape.num_experts, 16)
    n = int(align.num_padded.item())
    pair = align.sorted_ids[:n].long()
    valid = pair < ids.numel()
    tok = torch.where(valid, pair // ids.shape[1], 0)
    wt = torch.where(valid, w.reshape(-1)[pair.clamp(max=ids.numel() - 1)], 0.0).to(x.dtype)
    counts = torch.bincount(align.expert_ids[:n // 16].long(), minlength=p.shape.num_experts)
    offs = (counts * 16).cumsum(0).to(torch.int32)
    (w13, s13, w2, s2), inter = rw, p.shape.intermediate

    def run():
        a, sa = _quant_rows(x[tok])
        h = torch._scaled_grouped_mm(a, w13.transpose(1, 2), sa.flatten(), s13, offs=offs,
                                     out_dtype=x.dtype)
        y, sy = _quant_rows(clamped_swiglu(h[:, :inter], h[:, inter:], p.limit))
        o = torch._scaled_grouped_mm(y, w2.transpose(1, 2), sy.flatten(), s2, offs=offs,
                                     out_dtype=x.dtype)
        return torch.zeros_like(x).index_add_(0, tok, o * wt[:, None])
    return run


def _rates(us: float, weight_bytes: int, flops: int, ceil: dict) -> dict:
    """Rates and their fractions of the measured ceilings; the HBM ceiling is the larger of the
    copy and read rates, the roofline time max(bytes / HBM, FLOPs / FP8 peak)."""
    hbm = max(ceil["hbm_copy_tbs"], ceil["hbm_read_tbs"])
    tbs, tflops = weight_bytes / us / 1e6, flops / us / 1e6
    bound_us = max(weight_bytes / hbm, flops / ceil["fp8_scaled_mm_tflops"]) / 1e6
    return dict(us=us, weight_tbs=tbs, tflops=tflops, frac_hbm=tbs / hbm,
                frac_fp8=tflops / ceil["fp8_scaled_mm_tflops"], roofline_frac=bound_us / us)


def bench_moe(p: Problem, ids, m: int, table, ceil: dict, timer, rw=None) -> list[dict]:
    """One (E, M) case: every variant timed on the same route; ``rw``: rowwise_weights(p) or None
    to skip the torch baselines. Each torch baseline's relative error to the tuned Triton output
    is recorded (they use row-wise scales, so a few percent is expected)."""
    x, w = p.activations(m, seed=m)
    shape = p.shape
    pairs = int(((ids >= 0) & (ids < shape.num_experts)).sum())
    touched = int(torch.unique(ids[ids >= 0]).numel())
    per_expert = 3 * shape.hidden * shape.intermediate + 4 * (p.w13_scale[0].numel()
                                                              + p.w2_scale[0].numel())
    weight_bytes, flops = touched * per_expert, 6 * pairs * shape.hidden * shape.intermediate
    tuned = choose_config(m, table)
    variants = {"triton_tuned": lambda: fused_moe(x, ids, w, p.w13, p.w2, p.limit, p.w13_scale,
                                                  p.w2_scale, shape.block, tuned),
                "triton_default": lambda: fused_moe(x, ids, w, p.w13, p.w2, p.limit,
                                                    p.w13_scale, p.w2_scale, shape.block,
                                                    (DEFAULT_CONFIG, DEFAULT_CONFIG))}
    if rw is not None:
        variants["torch_loop"] = lambda: torch_loop(p, rw, x, ids, w)
        variants["torch_grouped"] = lambda: torch_grouped(p, rw, x, ids, w)
    base = dict(op="moe", E=shape.num_experts, M=m, D=shape.hidden, I=shape.intermediate,
                top_k=shape.top_k, pairs=pairs, experts_touched=touched,
                weight_bytes=weight_bytes, flops=flops, tuned_up=tuned[0].short(),
                tuned_down=tuned[1].short(), tuned_table=table is not None)
    rows, want = [], None
    for name, make in variants.items():
        try:
            fn = make() if name.startswith("torch") else make
            got = fn().float()
            want = got if want is None else want
            err = float((got - want).norm() / want.norm().clamp(min=1e-30))
            rows.append({**base, "variant": name, "relerr_vs_tuned": err,
                         **_rates(timer(fn), weight_bytes, flops, ceil)})
        except Exception as exc:  # a peer that does not run here is reported, not fatal
            rows.append({**base, "variant": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
    us = {r["variant"]: r.get("us") for r in rows}
    for r in rows:
        for ref in ("triton_default", "torch_loop", "torch_grouped"):
            if r.get("us") and us.get(ref):
                r[f"speedup_vs_{ref}"] = us[ref] / r["us"]
    return rows


def _differ(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of elements whose bits differ."""
    if a.dtype == FP8:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return float((a != b).float().mean())


def bench_act_quant(p: Problem, ids, timer, limit: float = 10.0) -> list[dict]:
    """Fused SwiGLU + FP8 quant vs the unfused kernel pair (and torch) on one real alignment.

    The fused kernel is timed with 16 and 64 (row, group) units per program (same bits)."""
    align = align_pairs(ids, p.shape.num_experts, 64)
    n = int(align.num_padded.item())
    h = torch.randn(align.max_rows, 2 * p.shape.intermediate, device=p.w13.device,
                    dtype=torch.bfloat16) * 4
    variants = {
        "fused": lambda: swiglu_quant(h, limit, align.num_padded),
        "fused_units64": lambda: _launch_swiglu(h, limit, align.num_padded, True, 128, 64),
        "unfused_triton": lambda: quant_act_fp8_triton(swiglu(h, limit, align.num_padded), 128,
                                                       align.num_padded),
        "unfused_torch": lambda: swiglu_quant_ref(h[:n], limit),
    }
    q, s = variants["fused"]()
    base = dict(op="act_quant", M=ids.shape[0], rows=n, I=p.shape.intermediate)
    for name in ("fused_units64", "unfused_triton", "unfused_torch"):
        q2, s2 = variants[name]()
        base[f"q_differ_vs_{name}"] = _differ(q[:n], q2[:n])
        base[f"scale_differ_vs_{name}"] = _differ(s[:n], s2[:n])
    y, y_ref = swiglu(h[:n], limit), clamped_swiglu(h[:n, :p.shape.intermediate],
                                                    h[:n, p.shape.intermediate:], limit)
    base["bf16_act_differ_vs_torch"] = _differ(y, y_ref)
    out = {name: timer(fn) for name, fn in variants.items()}
    return [{**base, "variant": k, "us": v, "speedup_of_fused": v / out["fused"]}
            for k, v in out.items()]


def bench_numerics(p: Problem, ids, table, m: int) -> dict:
    """Relative error of the tuned fused MoE against the fp32-accumulated W8A8 reference."""
    x, w = p.activations(m, seed=m + 1)
    out = fused_moe(x, ids, w, p.w13, p.w2, p.limit, p.w13_scale, p.w2_scale, p.shape.block,
                    choose_config(m, table)).float()
    ref = moe_experts_fp8_ref(x, ids, w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit,
                              p.shape.block).float()
    return dict(op="numerics", E=p.shape.num_experts, M=m,
                relerr_vs_w8a8_ref=float((out - ref).norm() / ref.norm()),
                max_abs_err=float((out - ref).abs().max()), ref_rms=float(ref.pow(2).mean().sqrt()))


def run(argv: list[str]) -> list[dict]:
    args = _args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the MoE benchmark needs a CUDA device")
    timer = GraphTimer()
    ceil = measure_ceilings()
    rows = [{"op": "ceiling", "variant": k, "value": v} for k, v in ceil.items()]
    samples = RoutingSamples.load(args.samples) if Path(args.samples).is_file() else None
    source = samples.source if samples else "uniform top-k (no samples)"
    experts = [int(e) for e in args.experts.split(",")]
    full = Problem.random(MoEShape(max(experts), 8, 4096, 2048), "cuda")
    rows += bench_act_quant(full, _route(samples, 8192, max(experts), seed=8192), timer)
    started = time.monotonic()
    for e in experts:
        p = full.narrow(e)
        table = read_table(p.shape, device_name(torch.device("cuda")), Path(args.configs))
        rw = None if args.no_torch else rowwise_weights(p)
        for m in (int(t) for t in args.tokens.split(",")):
            if args.time_budget and time.monotonic() - started > args.time_budget:
                rows.append({"op": "moe", "E": e, "M": m, "variant": "skipped (time budget)"})
                continue
            ids = _route(samples, m, e, seed=m)
            case = bench_moe(p, ids, m, table, ceil, timer, rw)
            print(_line(case), flush=True)
            rows += case
            if m == 256:
                rows.append(bench_numerics(p, ids, table, m))
    for r in rows:
        r.update(routes=source, **{f"ceiling_{k}": v for k, v in ceil.items()})
    return rows


def _line(rows: list[dict]) -> str:
    r0 = rows[0]
    cells = " ".join(f"{r['variant']}={r['us']:.1f}us" if "us" in r else f"{r['variant']}=ERR"
                     for r in rows)
    return f"E={r0['E']} M={r0['M']}: {cells}"
