"""glmlab's own MoE kernels in the MoE benchmark (``glmlab.bench.ops_moe``): one case's rows.

``Case`` is one (E, M): its inputs (the same tensors for every variant), alignments and down-GEMM
inputs per block_m, the byte and FLOP counts of a projection and of the whole MoE, and the two row
writers (``gemm_row``, ``moe_row``) that time a variant and turn an error into a row. The
functions below time glmlab's kernels through them: every candidate of the Triton grouped kernel
and of the Gluon kernels, the previous kernel, and the whole-MoE pipelines under the untuned
choice and under the best same-block_m pair of this case's GEMM rows (``Case.best``). The peers'
rows live in ``ops_moe_peers``; which rows a case gets, and in which order, ``ops_moe`` decides.
"""

from __future__ import annotations

import torch

from glmlab.kernels.fp8.quant_triton import quant_act_fp8_triton
from glmlab.kernels.moe.configs import choose_config
from glmlab.kernels.moe.fused_grouped import (
    GLUON_CANDIDATES,
    GLUON_DECODE_CANDIDATES,
    choose_gluon,
    choose_grouped,
    fused_moe_grouped,
    up_config_for,
)
from glmlab.kernels.moe.fused_moe import fused_moe
from glmlab.kernels.moe.gemm_triton import moe_gemm_down, moe_gemm_up
from glmlab.kernels.moe.grouped_gluon import GluonConfig, gluon_down, gluon_up
from glmlab.kernels.moe.grouped_gluon_decode import gluon_decode_down, gluon_decode_up
from glmlab.kernels.moe.grouped_triton import GroupedConfig, grouped_down, grouped_up
from glmlab.kernels.moe.permute_triton import gather_quant
from glmlab.kernels.moe.routing_triton import align_pairs
from glmlab.kernels.moe.tuner import Problem


def _rates(us: float, weight_bytes: int, flops: int, ceil: dict) -> dict:
    hbm = max(ceil["hbm_copy_tbs"], ceil["hbm_read_tbs"])
    tbs, tflops = weight_bytes / us / 1e6, flops / us / 1e6
    return dict(us=us, weight_tbs=tbs, tflops=tflops, frac_hbm=tbs / hbm,
                frac_fp8=tflops / ceil["fp8_scaled_mm_tflops"])


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
