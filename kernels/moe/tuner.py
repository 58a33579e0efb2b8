"""Tile tuning of the MoE grouped GEMMs on real routing, with held-out validation.

For each token count M the tuner draws M-token routes from routing samples (``samples.py``),
times every gate_up config and every down config of a search space on the *training* routes, and
picks the pair jointly: both GEMMs share one alignment, so for each BLOCK_SIZE_M it takes the best
up and the best down config and then the BLOCK_SIZE_M with the smallest up + down time. The
winner and the runners-up are re-timed on *held-out* routes (other samples: other steps/layers);
the report gives the held-out speedup over the default config and the gap between the winner and
the best candidate there; a winner slower than the default on held-out routes is not written
(``validation_guard``: the table keeps the default for that M). Each distinct winner then runs
the whole fused MoE against the block-FP8 reference with non-uniform weight and activation
scales (numerics check).

Inputs are synthetic (random E4M3 weights with non-uniform block scales); only the routing is
real, which is what decides the padding and per-expert load. The tuner knows nothing about files
or the command line (``glmlab tune moe`` does that).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from statistics import mean

import torch

from glmlab.kernels.fp8.quant_triton import quant_act_fp8_triton
from glmlab.kernels.fp8.ref import FP8
from glmlab.kernels.moe.configs import DEFAULT_CONFIG, ConfigTable, KernelConfig, MoEShape
from glmlab.kernels.moe.fused_moe import fused_moe
from glmlab.kernels.moe.gemm_triton import moe_gemm_down, moe_gemm_up
from glmlab.kernels.moe.ref import moe_experts_fp8_ref
from glmlab.kernels.moe.routing_triton import align_pairs
from glmlab.kernels.moe.samples import padded_rows, uniform_routes


@dataclass(frozen=True)
class SearchSpace:
    configs: tuple[KernelConfig, ...]

    @classmethod
    def product(cls, block_m=(16, 32, 64, 128), block_n=(64, 128, 256), block_k=(64, 128),
                group_m=(1, 16, 32), num_warps=(4, 8), num_stages=(2, 3, 4, 5),
                smem_limit: int = 232448) -> SearchSpace:
        """Every combination that fits ``smem_limit`` with FP8 tiles (BLOCK_K divides 128)."""
        cfgs = [KernelConfig(*c) for c in itertools.product(block_m, block_n, block_k, group_m,
                                                              num_warps, num_stages)]
        return cls(tuple(c for c in cfgs if 128 % c.block_k == 0 and c.smem_bytes(1) <= smem_limit))

    @property
    def block_ms(self) -> list[int]:
        return sorted({c.block_m for c in self.configs})


def _grid(bm: int, variants) -> list[KernelConfig]:
    return [KernelConfig(bm, n, 128, g, w, s) for n, g, w, s in variants]


# One H200 call's worth (13 configs per GEMM): small BLOCK_SIZE_M for decode, wide tiles for
# prefill.
REDUCED = SearchSpace(tuple(
    _grid(16, [(64, 16, 4, 4), (128, 16, 4, 3), (128, 16, 4, 5)])
    + _grid(32, [(64, 16, 4, 4), (128, 16, 4, 3), (128, 16, 4, 4)])
    + _grid(64, [(128, 32, 4, 3), (128, 16, 4, 4), (256, 16, 8, 3), (64, 16, 4, 4)])
    + _grid(128, [(128, 16, 8, 3), (128, 16, 4, 3), (256, 16, 8, 3)])))
# REDUCED plus more stages / widths / warps around it (49 configs per GEMM): the refinement pass
# for the headline M values.
WIDE = SearchSpace(tuple(dict.fromkeys(REDUCED.configs + tuple(
    _grid(16, [(n, 16, 4, s) for n in (64, 128) for s in (3, 4, 5)] + [(256, 16, 4, 3)])
    + _grid(32, [(n, 16, 4, s) for n in (64, 128) for s in (3, 4, 5)] + [(128, 16, 8, 4)])
    + _grid(64, [(n, g, w, s) for n in (64, 128, 256) for g in (1, 16) for w in (4, 8)
                 for s in (3, 4)])
    + _grid(128, [(n, 16, w, s) for n in (128, 256) for w in (4, 8) for s in (3, 4)])))))
# Two configs per GEMM for CPU runs under the interpreter (tests, the notebook).
CPU_SPACE = SearchSpace((KernelConfig(16, 32, 32, 1, 4, 2), KernelConfig(32, 64, 64, 4, 4, 2)))
SPACES = {"full": SearchSpace.product(), "wide": WIDE, "reduced": REDUCED, "cpu": CPU_SPACE}


@dataclass(frozen=True)
class TuneOptions:
    tokens: tuple[int, ...]
    routes: int = 3  # training routes per M
    heldout_routes: int = 2
    candidates: int = 3  # BLOCK_SIZE_M classes whose best pairs are re-timed on held-out routes
    time_budget_s: float | None = None  # M values not started within it are skipped
    numerics_tol: float = 2e-2  # relative L2 error of the fused MoE vs the FP8 reference
    seed: int = 0


@dataclass
class Problem:
    """Synthetic E4M3 expert weights with non-uniform block scales at one ``MoEShape``."""

    shape: MoEShape
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    act_dtype: torch.dtype = torch.bfloat16
    limit: float = 10.0

    @classmethod
    def random(cls, shape: MoEShape, device: str | torch.device, seed: int = 0) -> Problem:
        gen = torch.Generator(device).manual_seed(seed)
        e, d, i = shape.num_experts, shape.hidden, shape.intermediate

        def weight(n, k):
            w = torch.empty(e, n, k, dtype=torch.bfloat16, device=device)
            for j in range(e):  # one expert at a time keeps the temporary small
                w[j] = torch.randn(n, k, generator=gen, device=device, dtype=torch.bfloat16)
            scale = _nonuniform((e, -(-n // 128), -(-k // 128)), 2 ** -6, gen, device)
            return w.to(FP8), scale

        w13, s13 = weight(2 * i, d)
        w2, s2 = weight(d, i)
        return cls(shape, w13, s13, w2, s2)

    def narrow(self, num_experts: int) -> Problem:
        """The first ``num_experts`` experts (an EP rank's local view), sharing storage."""
        return replace(self, shape=replace(self.shape, num_experts=num_experts),
                       w13=self.w13[:num_experts], w13_scale=self.w13_scale[:num_experts],
                       w2=self.w2[:num_experts], w2_scale=self.w2_scale[:num_experts])

    def activations(self, m: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x [m, D] with per-token magnitudes spread over 2^-3..2^3, and routing weights."""
        dev = self.w13.device
        gen = torch.Generator(dev).manual_seed(seed)
        x = torch.randn(m, self.shape.hidden, generator=gen, device=dev)
        x = x * _nonuniform((m, 1), 1.0, gen, dev, spread=3)
        w = torch.rand(m, self.shape.top_k, generator=gen, device=dev) + 0.05
        return x.to(self.act_dtype), w / w.sum(-1, keepdim=True) * 2.5


def _nonuniform(shape, base, gen, device, spread: int = 2) -> torch.Tensor:
    """base * 2^U{-spread..spread} * U(0.5, 1.5): scales that differ block to block."""
    exp = torch.randint(-spread, spread + 1, shape, generator=gen, device=device).float()
    return base * torch.exp2(exp) * (torch.rand(shape, generator=gen, device=device) + 0.5)


@dataclass
class TuneResult:
    table: ConfigTable
    rows: list[dict] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)


Timer = Callable[[Callable[[], object]], float]
RouteSource = Callable[[int, int, str], list[torch.Tensor]]  # (m, count, "train"|"heldout")


class _Bench:
    """Times the two GEMMs of one problem on given routes (aligned once per BLOCK_SIZE_M)."""

    def __init__(self, problem: Problem, routes: list[torch.Tensor], timer: Timer, seed: int):
        self.p, self.timer = problem, timer
        self.routes = [r.to(problem.w13.device) for r in routes]
        self.inputs = []
        for j, r in enumerate(self.routes):
            x, w = problem.activations(r.shape[0], seed + j)
            self.inputs.append((*quant_act_fp8_triton(x, problem.shape.block[1]), w))
        self._aligned: dict[int, list] = {}

    def aligned(self, bm: int) -> list:
        if bm not in self._aligned:
            p, out = self.p, []
            for r in self.routes:
                al = align_pairs(r, p.shape.num_experts, bm)
                h = torch.randn(al.max_rows, p.shape.intermediate, device=r.device)
                out.append((al, *quant_act_fp8_triton(h, p.shape.block[1])))
            self._aligned[bm] = out
        return self._aligned[bm]

    def up(self, cfg: KernelConfig) -> float:
        p = self.p
        return mean(self.timer(lambda xq=xq, xs=xs, al=al: moe_gemm_up(
            xq, xs, p.w13, p.w13_scale, al, cfg, p.act_dtype, p.shape.block))
            for (xq, xs, _), (al, _, _) in zip(self.inputs, self.aligned(cfg.block_m), strict=True))

    def down(self, cfg: KernelConfig) -> float:
        p = self.p
        return mean(self.timer(lambda hq=hq, hs=hs, w=w, al=al: moe_gemm_down(
            hq, hs, p.w2, p.w2_scale, w, al, cfg, p.act_dtype, p.shape.block))
            for (_, _, w), (al, hq, hs) in zip(self.inputs, self.aligned(cfg.block_m), strict=True))

    def pair(self, up: KernelConfig, down: KernelConfig) -> float:
        return self.up(up) + self.down(down)

    def padding(self, bm: int) -> tuple[float, float]:
        rows = [padded_rows(r, self.p.shape.num_experts, bm) for r in self.routes]
        return mean(r for r, _ in rows), mean(p for _, p in rows)


def tune(problem: Problem, routes: RouteSource, options: TuneOptions, space: SearchSpace,
         timer: Timer, progress: bool = True) -> TuneResult:
    """Tune (up, down) per M in ``options.tokens``; see the module docstring."""
    from tqdm.auto import tqdm

    configs = list(dict.fromkeys([*space.configs, DEFAULT_CONFIG]))
    started, result = time.monotonic(), TuneResult(ConfigTable({}, {}))
    bar = tqdm(total=len(options.tokens) * len(configs) * 2, disable=not progress,
               desc=f"tune E={problem.shape.num_experts}")
    for m in options.tokens:
        if options.time_budget_s and time.monotonic() - started > options.time_budget_s:
            result.skipped.append(m)
            continue
        row, up, down = _tune_m(problem, m, routes, options, configs, timer, bar)
        result.table.up[m], result.table.down[m] = up, down
        result.rows.append(row)
    bar.close()
    checked: dict[tuple, float] = {}
    for row in result.rows:
        key = (result.table.up[row["M"]], result.table.down[row["M"]])
        if key not in checked:
            checked[key] = numerics_check(problem.shape, *key, problem.w13.device, options.seed)
        row["numerics_relerr"] = checked[key]
        row["numerics_ok"] = checked[key] <= options.numerics_tol
    return result


def _tune_m(problem, m, routes: RouteSource, options, configs, timer, bar):
    train = _Bench(problem, routes(m, options.routes, "train"), timer, options.seed)
    t_up, t_down = {}, {}
    for cfg in configs:
        t_up[cfg] = train.up(cfg)
        bar.update()
        t_down[cfg] = train.down(cfg)
        bar.update()
    best = {}  # BLOCK_SIZE_M -> (time, up, down)
    for bm in sorted({c.block_m for c in configs}):
        up = min((c for c in configs if c.block_m == bm), key=t_up.get)
        down = min((c for c in configs if c.block_m == bm), key=t_down.get)
        best[bm] = (t_up[up] + t_down[down], up, down)
    ranked = sorted(best.values(), key=lambda b: b[0])
    _, win_up, win_down = ranked[0]
    held = _Bench(problem, routes(m, options.heldout_routes, "heldout"), timer, options.seed + 99)
    # Held-out candidates: the runners-up inside the winning BLOCK_SIZE_M (2 best up x 2 best
    # down, the close calls) and the best pair of the next BLOCK_SIZE_M classes.
    same_bm = [c for c in configs if c.block_m == win_up.block_m]
    ups, downs = sorted(same_bm, key=t_up.get)[:2], sorted(same_bm, key=t_down.get)[:2]
    pairs = [(u, d) for u in ups for d in downs] + [(u, d) for _, u, d in
                                                    ranked[1:options.candidates]]
    cands = {pair: held.pair(*pair) for pair in dict.fromkeys(pairs)}
    held_default = held.pair(DEFAULT_CONFIG, DEFAULT_CONFIG)
    real, padded = train.padding(win_up.block_m)
    default_train = t_up[DEFAULT_CONFIG] + t_down[DEFAULT_CONFIG]
    row = dict(E=problem.shape.num_experts, M=m, pairs_real=real, rows_padded=padded,
               up=win_up.short(), down=win_down.short(), up_us=t_up[win_up],
               down_us=t_down[win_down], train_us=ranked[0][0], default_train_us=default_train,
               speedup_train=default_train / ranked[0][0],
               heldout_us=cands[(win_up, win_down)], default_heldout_us=held_default,
               speedup_heldout=held_default / cands[(win_up, win_down)],
               heldout_best_us=min(cands.values()),
               heldout_gap=cands[(win_up, win_down)] / min(cands.values()) - 1.0,
               routes=options.routes, heldout_routes=options.heldout_routes,
               configs_timed=len(configs), kept_default=False)
    if validation_guard(row):
        # the row names what the table holds; the training winner stays visible beside it
        row.update(kept_default=True, trained_up=row["up"], trained_down=row["down"],
                   up=DEFAULT_CONFIG.short(), down=DEFAULT_CONFIG.short())
        return row, DEFAULT_CONFIG, DEFAULT_CONFIG
    return row, win_up, win_down


def validation_guard(row: dict) -> bool:
    """True when the training winner loses to the default config on the held-out routes: then
    the table keeps the default (the training gain did not generalise)."""
    return row["heldout_us"] > row["default_heldout_us"]


def numerics_check(shape: MoEShape, up: KernelConfig, down: KernelConfig,
                   device: torch.device, seed: int = 0, num_experts: int = 8, m: int = 48
                   ) -> float:
    """Relative L2 error of ``fused_moe`` with (up, down) vs ``moe_experts_fp8_ref``.

    Same D and I as the tuned shape, ``num_experts`` experts, non-uniform weight and activation
    scales, a uniform route; the configs' code path does not depend on E or on the routing.
    """
    small = replace(shape, num_experts=min(num_experts, shape.num_experts))
    p = Problem.random(small, device, seed + 7)
    ids = uniform_routes(small.num_experts, small.top_k, m, 1, seed)[0].to(device)
    x, w = p.activations(m, seed + 3)
    out = fused_moe(x, ids, w, p.w13, p.w2, p.limit, p.w13_scale, p.w2_scale, small.block,
                    (up, down)).float()
    ref = moe_experts_fp8_ref(x, ids, w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit,
                              small.block).float()
    return float((out - ref).norm() / ref.norm().clamp(min=1e-30))
