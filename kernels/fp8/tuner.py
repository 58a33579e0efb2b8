"""Tuning the block-FP8 dense GEMM: time candidate tile configs per (M, N, K), keep the fastest.

``candidates(m, n, k)`` is the search space (a pure function, printable and tested on the CPU):
swap-AB weight streaming with and without split-K for small M, the CUDA-core GEMV beside it for
M <= 8, classic output tiles for larger M, activations quantised in the GEMM's prologue or once
beforehand, every candidate within the H200's shared memory, and ``torch._scaled_mm``'s
block-wise GEMM as a peer at every M (a call this torch or GPU refuses is recorded as failed,
with torch's message, like a Triton config that does not compile). ``tune_shape`` times each
with the caller's timer (CUDA-graph replays with an L2 flush on the GPU: the weights come from
HBM each call, as in a layer-by-layer forward), checks the fastest against
``ref.linear_fp8_ref`` and returns every timing, so a report can show the tuned pick beside the
rule's and beside a library GEMM of the same recipe. The timed call
includes the activation quantisation when a config does it separately: that is the work a
forward pays. Knows nothing about models; the caller names the shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from glmlab.kernels.fp8.gemm_configs import (
    GROUP,
    H200_SMS,
    SMALL_M,
    GemmConfig,
    rule_config,
    scaled_mm_config,
)
from glmlab.kernels.fp8.gemm_triton import linear_fp8
from glmlab.kernels.fp8.ref import (
    dequant_block_fp8,
    linear_fp8_ref,
    quant_act_fp8,
    quant_block_fp8,
)
from glmlab.kernels.moe.configs import SMEM_LIMIT  # one sm_90 budget for every tile rule

MAX_REL_ERR = 1e-2  # relative RMS vs the reference: Hopper's FP8 accumulation is ~1e-4 off
GEMV_TUNE_MAX_M = 8  # the rule stops the GEMV at 4 tokens on arithmetic; the tuner measures 8
# (block_n, block_k, num_warps) of the GEMV candidates: 8..32 KB of weights per program step
GEMV_TILES = ((16, 256, 4), (16, 512, 4), (32, 512, 4), (32, 512, 8), (64, 512, 8))


def candidates(m: int, n: int, k: int, act_bytes: int = 2) -> list[GemmConfig]:
    """The configs worth timing for y[M, N] = x[M, K] W[N, K]^T (the rule's pick included).

    Kept small on purpose (each distinct config is a Triton compile, ~1 s): weight streaming
    for M <= 64 (swap-AB, activations quantised in the prologue or once beforehand, split-K to
    fill the GPU);
    output tiles up to 128 x 256 for larger M, quantising in the prologue only while one
    column block's re-quantisation is cheap (M <= 256), split-K up to 4 there (at M = 128 the
    tiles of split 1-2 left the weight stream at 0.13-0.33 of HBM on the H200, commit 49b2526:
    one or two programs per SM do not keep enough bytes in flight) and 1 above."""
    k_blocks = -(-k // GROUP)
    splits = [s for s in (1, 2, 4, 8) if k_blocks // s >= 2]
    out: list[GemmConfig] = []
    if m <= SMALL_M:
        bm = 16
        while bm < m:
            bm *= 2
        # NOTE: both quantisation placements: on the first H200 run the bf16-input shapes
        # (prologue quantisation) streamed at 0.13-0.35 of HBM where the same kernel fed E4M3
        # reached 0.28-0.55 (the quantised tile goes registers -> shared memory every K step)
        out += [GemmConfig(bm, bn, split, swap_ab=True, fuse_quant=fuse)
                for bn in (64, 128) for split in splits for fuse in (True, False)]
    else:
        small = m <= 256
        for bm in (64, 128):
            for bn in (64, 128, 256):
                for split in splits[:3] if small else splits[:1]:
                    for fuse in (True, False) if small and bm == 64 else (False,):
                        warps = 4 if bm * bn <= 64 * 128 else 8
                        out.append(GemmConfig(bm, bn, split, swap_ab=False, fuse_quant=fuse,
                                              num_warps=warps, num_stages=4 if bm == 64 else 3))
        if small:  # tokens on the dot's N side, up to 128 of them per program
            out += [GemmConfig(128, bn, split, swap_ab=True, fuse_quant=False)
                    for bn in (64, 128) for split in splits[:3]]
    if m <= GEMV_TUNE_MAX_M:
        out += gemv_candidates(m, n, k)
    out.append(rule_config(m, n, k))
    if n % GROUP == 0 and k % GROUP == 0:
        out.append(scaled_mm_config())
    seen, kept = set(), []
    for c in out:
        if c not in seen and c.smem_bytes(act_bytes) <= SMEM_LIMIT:
            seen.add(c)
            kept.append(c)
    return kept


def gemv_candidates(m: int, n: int, k: int, num_sms: int = H200_SMS) -> list[GemmConfig]:
    """The GEMV configs worth timing: ``GEMV_TILES`` x both quantisation placements x the two
    smallest splits that give >= 4 programs per SM (the loads are not pipelined, so resident
    programs are what keeps bytes in flight), within the K steps and the partials bound."""
    bm = 1
    while bm < m:
        bm *= 2
    out = []
    for bn, bk, warps in GEMV_TILES:
        tiles = -(-n // bn)
        splits = [s for s in (1, 2, 4, 8, 16) if s <= -(-k // bk) and 2 * s * 16 * m <= k]
        fill = [s for s in splits if tiles * s >= 4 * num_sms]
        for split in fill[:2] or splits[-1:]:
            out += [GemmConfig(bm, bn, split, swap_ab=False, fuse_quant=fuse, num_warps=warps,
                               num_stages=1, block_k=bk, kind="gemv") for fuse in (True, False)]
    return out


@dataclass(frozen=True)
class Timing:
    config: GemmConfig
    us: float


@dataclass(frozen=True)
class ShapeResult:
    m: int
    n: int
    k: int
    timings: tuple[Timing, ...]  # every candidate that ran, fastest first
    best_rel_err: float  # the fastest config's output vs the reference
    failed: tuple[str, ...]  # candidates that did not compile or launch, with the reason

    @property
    def best(self) -> Timing:
        return self.timings[0]

    def time_of(self, config: GemmConfig) -> float | None:
        return next((t.us for t in self.timings if t.config == config), None)

    def best_of(self, kind: str) -> Timing | None:
        """The fastest candidate of one ``GemmConfig.kind`` (timings are sorted by time, apart
        from the verified pick moved first)."""
        return min((t for t in self.timings if t.config.kind == kind), key=lambda t: t.us,
                   default=None)

    def failure_of(self, config: GemmConfig) -> str | None:
        return next((f for f in self.failed if f.startswith(f"{config.short()}: ")), None)


def problem(m: int, n: int, k: int, device, dtype=torch.bfloat16, seed: int = 0):
    """(x [M, K], E4M3 weight [N, K], block scales) with the magnitudes of a model's linears."""
    g = torch.Generator(device).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=device).to(dtype)
    w, s = quant_block_fp8(torch.randn(n, k, generator=g, device=device) / k ** 0.5)
    return x, w, s


def tune_shape(m: int, n: int, k: int, timer: Callable[[Callable[[], object]], float],
               device="cuda", dtype=torch.bfloat16, act_fp8: bool = False,
               configs: list[GemmConfig] | None = None) -> ShapeResult:
    """Time every candidate (microseconds per call from ``timer``); the fastest one that matches
    the reference comes first. ``act_fp8``: the caller passes E4M3 activations with their scales
    (as a SwiGLU that quantises on its way out does), so no config quantises."""
    x, w, s = problem(m, n, k, device, dtype)
    xs = None
    if act_fp8:
        x, xs = quant_act_fp8(x)
    space = configs or candidates(m, n, k, x.element_size())
    if act_fp8:
        space = list(dict.fromkeys(replace(c, fuse_quant=False) for c in space))
    timings, failed = [], []
    for cfg in space:
        try:
            us = timer(lambda cfg=cfg: linear_fp8(x, w, s, x_scale=xs, config=cfg))
        except Exception as e:  # noqa: BLE001 - a candidate that cannot run is skipped, named
            failed.append(f"{cfg.short()}: {type(e).__name__}: {str(e)[:120]}")
            continue
        timings.append(Timing(cfg, us))
    if not timings:
        raise RuntimeError(f"no config ran for {m}x{n}x{k}: {failed}")
    timings.sort(key=lambda t: t.us)
    want = (linear_fp8_ref(x, w, s) if xs is None else _ref_prequantised(x, xs, w, s)).float()
    for i, t in enumerate(timings):  # the fastest config whose output is right
        got = linear_fp8(x, w, s, x_scale=xs, config=t.config).float()
        err = float((got - want).norm() / want.norm())
        if err < MAX_REL_ERR:
            timings.insert(0, timings.pop(i))
            return ShapeResult(m, n, k, tuple(timings), err, tuple(failed))
        failed.append(f"{t.config.short()}: relative error {err:.2e}")
    raise RuntimeError(f"no config matched the reference for {m}x{n}x{k}: {failed}")


def _ref_prequantised(xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, s: torch.Tensor
                      ) -> torch.Tensor:
    """The reference product of E4M3 activations with their per-128 scales, in bf16."""
    a = dequant_block_fp8(xq, xs, torch.float32, (1, GROUP))
    return (a @ dequant_block_fp8(w, s, torch.float32, (GROUP, GROUP)).t()).to(torch.bfloat16)
