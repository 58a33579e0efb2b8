"""MoE kernel benchmark, kernel to kernel (``python -m glmlab.bench.ops_moe --stream FILE``).

GLM-5.3-Flash shapes: D 4096, I 2048, top-8; E = 288 (one rank holds every expert) and E = 72
(EP4 rank 0: routes over 288 experts, other ranks' pairs dropped). Routes are uniform top-8 over
288 experts (seed = M; ``--samples FILE`` uses captured routing instead). Inputs are the same
tensors for every variant: E4M3 weights with non-uniform 128x128 block scales, x quantised per
token per 128 channels. Timing: CUDA graphs, a 96 MB L2 flush before each call (flush subtracted).

``op = "gemm"`` rows (one projection, ``proj`` up / down), each saying what it includes:

- ``glmlab_grouped[cfg]``: grouped_triton, every candidate of ``GROUPED_CANDIDATES`` plus the
  untuned choice; up *includes* the SwiGLU + FP8 requant epilogue (its output is E4M3).
- ``glmlab_previous``: gemm_triton with its tuned table (up writes bf16, no activation).
- ``sglang``: SGLang 0.5.23's ``fused_moe_kernel`` (its wheel, its shipped H200 table for E=72,
  its default for E=288), up writes bf16.
- ``torch_block_loop``: per expert ``torch._scaled_mm`` with 1x128 / 128x128 block scales (the
  same recipe), rows pre-gathered and padded to 16; ``torch_grouped_block``: one
  ``F.scaled_grouped_mm`` with block scales, where torch supports it (else the error).

``op = "moe"`` rows: the whole routed MoE from (x bf16, ids, weights) to [T, D], every step
timed: ``glmlab_grouped`` (align + quant + up/act + down + combine), ``glmlab_grouped_best``
(the best same-block_m up/down pair of this case's GEMM rows), ``glmlab_previous`` (align +
quant + up + act/quant + down + combine), ``sglang`` (glmlab's align and quantisation, SGLang's
up GEMM, act_and_mul with the clamp and down GEMM, glmlab's combine). ``op = "check"``: relative
error of each whole MoE against the fp32 W8A8 reference. Rates: FP8 TFLOP/s (2·rows·N·K per
GEMM), weight TB/s (touched experts' E4M3 weights + scales once) and their fractions of the
ceilings measured in the same run. GPU only; each variant is guarded (errors become rows).

This module: the flags, the cases and the order of their rows (``run_case``), the numerics check
and the comparison table. ``ops_moe_case``: ``Case`` and glmlab's kernels' rows;
``ops_moe_peers``: SGLang's and torch's rows.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton

from glmlab.bench.ops_moe_case import (
    Case,
    bench_gluon,
    bench_gluon_pipeline,
    bench_grouped,
    bench_pipelines,
    bench_previous,
)
from glmlab.bench.ops_moe_peers import bench_sglang, bench_torch, sglang_moe
from glmlab.kernels.moe import peers
from glmlab.kernels.moe.configs import MoEShape, read_table
from glmlab.kernels.moe.fused_grouped import (
    GLUON_DECODE,
    GLUON_PREFILL,
    GROUPED_CANDIDATES,
    PREFILL,
    choose_grouped,
    fused_moe_grouped,
)
from glmlab.kernels.moe.fused_moe import device_name, fused_moe
from glmlab.kernels.moe.ref import moe_experts_fp8_ref
from glmlab.kernels.moe.timing import GraphTimer, measure_ceilings
from glmlab.kernels.moe.tuner import Problem

TOKENS = (8192, 1024, 64, 8, 1)  # most informative first: a time budget cuts the tail


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmlab.bench.ops_moe")
    p.add_argument("--experts", default="288,72", help="local expert counts (288 = all)")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--intermediate", type=int, default=2048, help="moe_intermediate_size")
    p.add_argument("--samples", help="routing samples file (default: uniform top-8)")
    p.add_argument("--sglang-wheel", help="sglang wheel (default: .whl/sglang-*.whl)")
    p.add_argument("--candidates", default="all", choices=("all", "default"))
    p.add_argument("--ws", choices=("with", "without", "only"), default="with",
                   help="warp-specialised candidates; only: just those GEMM rows")
    p.add_argument("--gluon", choices=("with", "without", "only"), default="with",
                   help="the warp-specialised Gluon kernels (only: just their rows + checks)")
    p.add_argument("--check-m", type=int, default=64, help="M of the numerics check rows")
    p.add_argument("--time-budget", type=float, help="seconds; later cases are skipped")
    p.add_argument("--stream", help="append each case's rows to this JSONL file as it goes")
    return p.parse_args(argv)


def _route(m: int, e: int, samples, seed: int) -> torch.Tensor:
    if samples is not None:
        from glmlab.kernels.moe.samples import routes_for_m

        ids = routes_for_m(samples, m, 1, seed)[0]
    else:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.rand(m, 288, generator=gen).topk(8, dim=1).indices
    return torch.where(ids < e, ids, -1).to(torch.int32).cuda()


def check_numerics(c: Case, module, tables, gluon: bool = True, others: bool = True
                   ) -> list[dict]:
    p = c.p
    ref = moe_experts_fp8_ref(c.x, c.ids, c.w, p.w13, p.w13_scale, p.w2, p.w2_scale,
                              p.limit).float()
    outs = {}
    if gluon:
        outs["glmlab_gluon"] = lambda: fused_moe_grouped(
            c.x, c.ids, c.w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit, GLUON_PREFILL)
        for tok, cfgs in GLUON_DECODE.items():
            outs[f"glmlab_gluon_decode{tok}"] = lambda cfgs=cfgs: fused_moe_grouped(
                c.x, c.ids, c.w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit, cfgs)
    if not others:
        return _check_rows(c, ref, outs)
    outs["glmlab_grouped"] = lambda: fused_moe_grouped(
        c.x, c.ids, c.w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit)
    outs["glmlab_grouped_prefill_tiles"] = lambda: fused_moe_grouped(
        c.x, c.ids, c.w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit, PREFILL)
    outs["glmlab_previous"] = lambda: fused_moe(c.x, c.ids, c.w, p.w13, p.w2, p.limit,
                                                p.w13_scale, p.w2_scale)
    if module is not None:
        sg = peers.SGLangMoE(module, *tables, c.m)
        outs["sglang"] = lambda: sglang_moe(c, sg, c.align(sg.up_cfg["BLOCK_SIZE_M"]))
    return _check_rows(c, ref, outs)


def _check_rows(c: Case, ref: torch.Tensor, outs: dict) -> list[dict]:
    rows = []
    for name, fn in outs.items():
        row = dict(op="check", variant=name, **c.base)
        try:
            out = fn().float()
            row["relerr_vs_w8a8_ref"] = float((out - ref).norm() / ref.norm())
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        rows.append(row)
    return rows


def run(argv: list[str]) -> list[dict]:
    args = _args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the MoE benchmark needs a CUDA device")
    from glmlab.bench.ops import machine

    rows: list[dict] = []
    stream = Path(args.stream) if args.stream else None
    meta = [machine()]  # provenance (nvidia-smi, git): once per case, not once per row

    def emit(row: dict) -> None:
        rows.append(row)
        if stream is not None:
            with stream.open("a") as f:
                f.write(json.dumps({**meta[0], **row}) + "\n")
        if "us" in row or "error" in row or "relerr_vs_w8a8_ref" in row:
            print({k: row.get(k) for k in ("op", "E", "M", "proj", "variant", "config", "us",
                                           "tflops", "frac_fp8", "frac_hbm",
                                           "relerr_vs_w8a8_ref", "error") if k in row},
                  flush=True)

    timer = GraphTimer()
    ceil = measure_ceilings()
    for k, v in ceil.items():
        emit({"op": "ceiling", "variant": k, "value": v})
    wheel = args.sglang_wheel or peers.find_wheel(".")
    module, err = None, "no sglang wheel under .whl/"
    if wheel:
        try:
            module = peers.load_sglang(wheel)
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"[:400]
    emit({"op": "peer", "variant": "sglang", "wheel": str(wheel), "loaded": module is not None,
          **({} if module is not None else {"error": err})})
    samples = None
    if args.samples:
        from glmlab.kernels.moe.samples import RoutingSamples

        samples = RoutingSamples.load(args.samples)
    experts = [int(e) for e in args.experts.split(",")]
    full = Problem.random(MoEShape(max(experts), 8, 4096, args.intermediate), "cuda")
    dev = device_name(torch.device("cuda"))
    per_e = {}
    for e in experts:
        p = full.narrow(e)
        tables, src = (None, None), None
        if module is not None:
            *tables, src = peers.sglang_configs(wheel, e, args.intermediate, dev,
                                                triton.__version__)
        per_e[e] = (p, read_table(p.shape, dev), tables, src)
    started = time.monotonic()
    for m in (int(t) for t in args.tokens.split(",")):
        for e, (p, table, tables, src) in per_e.items():
            if args.time_budget and time.monotonic() - started > args.time_budget:
                emit({"op": "skipped", "E": e, "M": m, "reason": "time budget"})
                continue
            meta[0] = machine()
            c = Case(p, _route(m, e, samples, seed=m), m, ceil, timer, emit)
            run_case(c, args, module, table, tables, src)
            del c
            torch.cuda.empty_cache()
    print_comparison(rows)
    return rows


def print_comparison(rows: list[dict]) -> None:
    """The kernel-to-kernel table (analysis.kernel_comparison) as fixed-width text."""
    from glmlab.kernels.moe.analysis import kernel_comparison

    table = kernel_comparison(rows)
    cols = ("op", "E", "M", "proj", "kernel", "us", "tflops", "frac_fp8", "frac_hbm",
            "x_sglang", "config")
    print(" ".join(f"{c:>10}" for c in cols))
    for r in table:
        print(" ".join(f"{str(r[c]):>10}" for c in cols))


def run_case(c: Case, args, module, table, tables, src) -> None:
    """One (E, M): the new Gluon kernel first (the risky variant; its rows land before the
    rest), then the Triton grouped kernel's candidates, the previous kernel, the peers, the
    whole-MoE pipelines and, at ``--check-m``, the numerics checks."""
    gluon = args.gluon != "without" and c.p.shape.hidden % 256 == 0
    if gluon:
        for proj in ("up", "down"):
            bench_gluon(c, proj)
        bench_gluon_pipeline(c)
    if args.gluon == "only":
        if c.m == args.check_m:
            for row in check_numerics(c, module, tables, gluon=True, others=False):
                c.emit(row)
        return
    default = choose_grouped(c.m, c.p.shape.num_experts, c.p.shape.top_k)
    for i, proj in enumerate(("up", "down")):
        cands = [] if args.candidates == "default" else [
            g for g in GROUPED_CANDIDATES[proj]
            if {"with": True, "without": not g.warp_specialize,
                "only": g.warp_specialize}[args.ws]]
        bench_grouped(c, cands, proj, cands[0] if args.ws == "only" else default[i])
    if args.ws == "only":
        return
    bench_previous(c, table)
    if module is not None:
        bench_sglang(c, module, tables, src)
    bench_torch(c)
    bench_pipelines(c)
    if c.m == args.check_m:
        for row in check_numerics(c, module, tables, gluon=gluon):
            c.emit(row)


def main(argv: list[str] | None = None) -> int:
    import sys

    run(sys.argv[1:] if argv is None else argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
