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
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton

from glmlab.kernels.fp8.quant_triton import quant_act_fp8_triton
from glmlab.kernels.moe import peers
from glmlab.kernels.moe.act_triton import combine
from glmlab.kernels.moe.configs import MoEShape, choose_config, read_table
from glmlab.kernels.moe.fused_grouped import (
    GLUON_CANDIDATES,
    GLUON_DECODE,
    GLUON_DECODE_CANDIDATES,
    GLUON_PREFILL,
    GROUPED_CANDIDATES,
    PREFILL,
    choose_gluon,
    choose_grouped,
    fused_moe_grouped,
    up_config_for,
)
from glmlab.kernels.moe.fused_moe import device_name, fused_moe
from glmlab.kernels.moe.gemm_triton import moe_gemm_down, moe_gemm_up
from glmlab.kernels.moe.grouped_gluon import GluonConfig, gluon_down, gluon_up
from glmlab.kernels.moe.grouped_gluon_decode import gluon_decode_down, gluon_decode_up
from glmlab.kernels.moe.grouped_triton import GroupedConfig, grouped_down, grouped_up
from glmlab.kernels.moe.permute_triton import gather_quant
from glmlab.kernels.moe.ref import moe_experts_fp8_ref
from glmlab.kernels.moe.routing_triton import align_pairs
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


def _rates(us: float, weight_bytes: int, flops: int, ceil: dict) -> dict:
    hbm = max(ceil["hbm_copy_tbs"], ceil["hbm_read_tbs"])
    tbs, tflops = weight_bytes / us / 1e6, flops / us / 1e6
    return dict(us=us, weight_tbs=tbs, tflops=tflops, frac_hbm=tbs / hbm,
                frac_fp8=tflops / ceil["fp8_scaled_mm_tflops"])


def _route(m: int, e: int, samples, seed: int) -> torch.Tensor:
    if samples is not None:
        from glmlab.kernels.moe.samples import routes_for_m

        ids = routes_for_m(samples, m, 1, seed)[0]
    else:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.rand(m, 288, generator=gen).topk(8, dim=1).indices
    return torch.where(ids < e, ids, -1).to(torch.int32).cuda()


class Case:
    """One (E, M): inputs, alignments per block_m, byte/FLOP counts, the timer, the rows."""

    def __init__(self, p: Problem, ids, m: int, ceil: dict, timer, emit):
        self.p, self.ids, self.m, self.ceil, self.timer, self.emit = p, ids, m, ceil, timer, emit
        self.x, self.w = p.activations(m, seed=m)
        self.xq, self.xs = quant_act_fp8_triton(self.x, 128)
        e, d, i = p.shape.num_experts, p.shape.hidden, p.shape.intermediate
        local = (ids >= 0) & (ids < e)
        self.pairs, self.touched = int(local.sum()), int(torch.unique(ids[local]).numel())
        self.base = dict(E=e, M=m, D=d, I=i, top_k=p.shape.top_k, pairs=self.pairs,
                         experts_touched=self.touched)
        self.proj = {"up": (2 * i, d, p.w13_scale), "down": (d, i, p.w2_scale)}
        self._align, self._h8 = {}, {}
        self.best: dict[tuple[str, int], tuple[float, GroupedConfig]] = {}

    def align(self, bm: int):
        if bm not in self._align:
            self._align[bm] = align_pairs(self.ids, self.p.shape.num_experts, bm)
        return self._align[bm]

    def h8(self, bm: int):
        """Real down-GEMM inputs (E4M3 activations in aligned order) for block_m ``bm``."""
        if bm not in self._h8:
            cfg = up_config_for(bm)
            self._h8[bm] = grouped_up(self.xq, self.xs, self.p.w13, self.p.w13_scale,
                                      self.align(bm), cfg, self.p.limit)
        return self._h8[bm]

    def gemm_row(self, proj: str, variant: str, fn, includes: str, **extra) -> float | None:
        n, k, scale = self.proj[proj]
        flops = 2 * self.pairs * n * k
        wbytes = self.touched * (n * k + 4 * scale[0].numel())
        row = dict(op="gemm", proj=proj, variant=variant, includes=includes, flops=flops,
                   weight_bytes=wbytes, **self.base, **extra)
        try:
            us = self.timer(fn)
            row.update(_rates(us, wbytes, flops, self.ceil))
        except Exception as exc:  # a variant that cannot run here is a row, not a crash
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
            us = None
        self.emit(row)
        return us

    def moe_row(self, variant: str, fn, includes: str, **extra) -> None:
        i, d = self.p.shape.intermediate, self.p.shape.hidden
        flops = 6 * self.pairs * d * i
        wbytes = self.touched * (3 * d * i + 4 * (self.p.w13_scale[0].numel()
                                                  + self.p.w2_scale[0].numel()))
        row = dict(op="moe", variant=variant, includes=includes, flops=flops,
                   weight_bytes=wbytes, **self.base, **extra)
        try:
            row.update(_rates(self.timer(fn), wbytes, flops, self.ceil))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        self.emit(row)


def bench_grouped(c: Case, candidates: list[GroupedConfig], proj: str, default: GroupedConfig):
    p = c.p
    for cfg in dict.fromkeys([default, *candidates]):
        tag = dict(config=cfg.short(), untuned_choice=cfg == default)
        al = c.align(cfg.block_m)
        if proj == "up":
            if cfg.gather_a:
                a, a_s = c.xq, c.xs
            else:
                a, a_s = gather_quant(c.x, al)
            fn = (lambda a=a, a_s=a_s, al=al, cfg=cfg: grouped_up(
                a, a_s, p.w13, p.w13_scale, al, cfg, p.limit))
            inc = "gate_up GEMM + clamped SwiGLU + FP8 requant epilogue (E4M3 out)"
        else:
            h8, hs = c.h8(cfg.block_m)
            fn = (lambda h8=h8, hs=hs, al=al, cfg=cfg: grouped_down(
                h8, hs, p.w2, p.w2_scale, c.w, al, cfg, torch.bfloat16))
            inc = "down GEMM + routing weight + scatter to pair rows"
        us = c.gemm_row(proj, "glmlab_grouped", fn, inc, **tag)
        key = (proj, cfg.block_m)
        if us is not None and (key not in c.best or us < c.best[key][0]):
            c.best[key] = (us, cfg)


def gluon_configs(c: Case, proj: str) -> list:
    """Gluon candidates for this case: the 128-row kernel's always, the swapped (decode)
    kernel's while an expert averages <= 64 rows (routes are over 288 experts); the untuned
    choice (``choose_gluon``) first."""
    default = choose_gluon(c.m, 288, c.p.shape.top_k)[0 if proj == "up" else 1]
    cands = list(GLUON_CANDIDATES[proj])
    if c.m * c.p.shape.top_k / 288 <= 64:
        cands += GLUON_DECODE_CANDIDATES[proj]
    return list(dict.fromkeys([default, *cands]))


def bench_gluon(c: Case, proj: str):
    """The warp-specialised Gluon kernels (grouped_gluon, grouped_gluon_decode)."""
    p = c.p
    cfgs = gluon_configs(c, proj)
    for i, cfg in enumerate(cfgs):
        al = c.align(cfg.block_m)
        prefill = isinstance(cfg, GluonConfig)
        kind = "Gluon WS" + ("" if prefill else f", swapped: {cfg.tok}-row token tiles")
        if proj == "up":
            a, a_s = gather_quant(c.x, al)
            gemm = gluon_up if prefill else gluon_decode_up
            fn = (lambda cfg=cfg, al=al, a=a, a_s=a_s, gemm=gemm: gemm(
                a, a_s, p.w13, p.w13_scale, al, cfg, p.limit))
            inc = (f"gate_up GEMM + clamped SwiGLU + FP8 requant epilogue (E4M3 out); {kind}; "
                   "A rows pre-gathered by gather_quant (timed in the MoE row)")
        else:
            h8, hs = c.h8(cfg.block_m)
            gemm = gluon_down if prefill else gluon_decode_down
            fn = (lambda cfg=cfg, al=al, h8=h8, hs=hs, gemm=gemm: gemm(
                h8, hs, p.w2, p.w2_scale, c.w, al, cfg, torch.bfloat16))
            inc = f"down GEMM + routing weight + scatter to pair rows; {kind}"
        us = c.gemm_row(proj, "glmlab_gluon", fn, inc, config=cfg.short(),
                        untuned_choice=i == 0)
        key = ("gluon", proj, cfg.block_m)
        if us is not None and (key not in c.best or us < c.best[key][0]):
            c.best[key] = (us, cfg)


def bench_previous(c: Case, table):
    p = c.p
    up_cfg, down_cfg = choose_config(c.m, table)
    al = c.align(up_cfg.block_m)
    h8, hs = c.h8(up_cfg.block_m)
    c.gemm_row("up", "glmlab_previous", lambda: moe_gemm_up(
        c.xq, c.xs, p.w13, p.w13_scale, al, up_cfg, torch.bfloat16), "gate_up GEMM (bf16 out)",
        config=up_cfg.short())
    c.gemm_row("down", "glmlab_previous", lambda: moe_gemm_down(
        h8, hs, p.w2, p.w2_scale, c.w, al, down_cfg, torch.bfloat16),
        "down GEMM + routing weight + scatter", config=down_cfg.short())
    c.moe_row("glmlab_previous", lambda: fused_moe(
        c.x, c.ids, c.w, p.w13, p.w2, p.limit, p.w13_scale, p.w2_scale, (128, 128),
        (up_cfg, down_cfg)), "align + quant + up + SwiGLU/quant + down + combine",
        config=f"{up_cfg.short()}/{down_cfg.short()}")


def _pair_order(h8, hs, al, num_pairs):
    """Aligned rows -> pair order (row t*A + a), what SGLang's non-TMA down GEMM reads."""
    n = int(al.num_padded.item())
    pair = al.sorted_ids[:n].long()
    ok = pair < num_pairs
    q = torch.zeros(num_pairs, h8.shape[1], dtype=h8.dtype, device=h8.device)
    s = torch.ones(num_pairs, hs.shape[1], dtype=hs.dtype, device=hs.device)
    q.view(torch.uint8)[pair[ok]] = h8[:n][ok].view(torch.uint8)
    s[pair[ok]] = hs[:n][ok]
    return q, s


def bench_sglang(c: Case, module, tables, source: str):
    p, tag = c.p, dict(config_source=source)
    sg = peers.SGLangMoE(module, *tables, c.m)
    al_up = c.align(sg.up_cfg["BLOCK_SIZE_M"])
    c.gemm_row("up", "sglang", lambda: sg.up(c.xq, c.xs, p.w13, p.w13_scale, c.w, c.ids, al_up),
               "gate_up GEMM (bf16 out" + (", sorted rows)" if sg.down_tma else ")"),
               config=json.dumps(sg.up_cfg | {"USE_TMA": sg.up_tma}), **tag)
    al_dn = c.align(sg.down_cfg["BLOCK_SIZE_M"])
    h8, hs = c.h8(sg.down_cfg["BLOCK_SIZE_M"])
    if not sg.down_tma:
        h8, hs = _pair_order(h8, hs, al_dn, c.ids.numel())
    c.gemm_row("down", "sglang", lambda: sg.down(h8, hs, p.w2, p.w2_scale, c.w, c.ids, al_dn),
               "down GEMM + routing weight (pair rows)",
               config=json.dumps(sg.down_cfg | {"USE_TMA": sg.down_tma}), **tag)
    if sg.up_cfg["BLOCK_SIZE_M"] != sg.down_cfg["BLOCK_SIZE_M"]:
        return  # sglang aligns once, with the up table's BLOCK_SIZE_M
    c.moe_row("sglang", lambda: sglang_moe(c, sg, al_up),
              "glmlab align + quant, sglang up GEMM + act_and_mul(clamp), glmlab quant, "
              "sglang down GEMM, glmlab combine", **tag)


def sglang_moe(c: Case, sg: peers.SGLangMoE, al) -> torch.Tensor:
    p = c.p
    al = align_pairs(c.ids, p.shape.num_experts, al.block_m)
    xq, xs = quant_act_fp8_triton(c.x, 128)
    h = sg.up(xq, xs, p.w13, p.w13_scale, c.w, c.ids, al)
    y8, ys = quant_act_fp8_triton(sg.act(h, c.ids, al, p.limit), 128)
    return combine(sg.down(y8, ys, p.w2, p.w2_scale, c.w, c.ids, al), c.ids,
                   p.shape.num_experts)


def bench_torch(c: Case):
    """Per-expert cuBLASLt block-scaled GEMMs (same recipe) and the grouped block-scaled form."""
    p = c.p
    al = c.align(16)
    n = int(al.num_padded.item())
    pair = al.sorted_ids[:n].long()
    tok = torch.where(pair < c.ids.numel(), pair // c.ids.shape[1], 0)
    a, a_s = c.xq[tok], c.xs[tok]
    experts = al.expert_ids[:n // 16].long()
    counts = torch.bincount(experts, minlength=p.shape.num_experts) * 16
    spans = [(e, int(s), int(s + k)) for e, (s, k) in enumerate(zip(
        (counts.cumsum(0) - counts).tolist(), counts.tolist(), strict=True)) if k]
    h8, hs = c.h8(16)

    def loop(a, a_s, w, w_s):
        return [peers.torch_block_mm(a[s:t], a_s[s:t], w[e], w_s[e]) for e, s, t in spans]

    inc = "per-expert torch._scaled_mm, block scales, rows pre-gathered (16-padded)"
    c.gemm_row("up", "torch_block_loop", lambda: loop(a, a_s, p.w13, p.w13_scale), inc)
    c.gemm_row("down", "torch_block_loop", lambda: loop(h8, hs, p.w2, p.w2_scale), inc)
    offs = counts.cumsum(0).to(torch.int32)
    c.gemm_row("up", "torch_grouped_block", lambda: peers.torch_grouped_block(
        a, a_s, p.w13, p.w13_scale, offs), "F.scaled_grouped_mm, block scales, pre-gathered")


def bench_gluon_pipeline(c: Case):
    p = c.p
    default = choose_gluon(c.m, 288, p.shape.top_k)
    c.moe_row("glmlab_gluon", lambda: fused_moe_grouped(
        c.x, c.ids, c.w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit, default),
        "align + gather-quant + up/act/requant + down + combine (Gluon WS GEMMs)",
        config=f"{default[0].short()}/{default[1].short()}")
    pairs = [(c.best[("gluon", "up", bm)][0] + c.best[("gluon", "down", bm)][0], bm)
             for bm in (16, 32, 64, 128)
             if ("gluon", "up", bm) in c.best and ("gluon", "down", bm) in c.best]
    if pairs:
        bm = min(pairs)[1]
        cfgs = (c.best[("gluon", "up", bm)][1], c.best[("gluon", "down", bm)][1])
        if cfgs != default:
            c.moe_row("glmlab_gluon_best", lambda: fused_moe_grouped(
                c.x, c.ids, c.w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit, cfgs),
                "as glmlab_gluon, configs: best same-alignment pair of this case's Gluon rows",
                config=f"{cfgs[0].short()}/{cfgs[1].short()}")


def bench_pipelines(c: Case):
    p = c.p
    default = choose_grouped(c.m, p.shape.num_experts, p.shape.top_k)
    c.moe_row("glmlab_grouped", lambda: fused_moe_grouped(
        c.x, c.ids, c.w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit, default),
        "align + quant + up/act/requant + down + combine",
        config=f"{default[0].short()}/{default[1].short()}")
    pairs = [(c.best[("up", bm)][0] + c.best[("down", bm)][0], bm) for bm in (16, 32, 64, 128)
             if ("up", bm) in c.best and ("down", bm) in c.best]
    if pairs:
        bm = min(pairs)[1]
        cfgs = (c.best[("up", bm)][1], c.best[("down", bm)][1])
        c.moe_row("glmlab_grouped_best", lambda: fused_moe_grouped(
            c.x, c.ids, c.w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit, cfgs),
            "as glmlab_grouped, configs: best same-block_m pair of this case's GEMM rows",
            config=f"{cfgs[0].short()}/{cfgs[1].short()}")


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
