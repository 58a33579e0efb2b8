"""GPU checks of the warp-specialised Gluon grouped kernels (``grouped_gluon``), H200 widths.

Gluon has no CPU interpreter, so this file is the kernels' numerics gate: the H200 session runs
it in its own process, under a time limit (a barrier bug hangs rather than fails), before any
Gluon row is benchmarked. References: the fp32 W8A8 torch reference for the whole MoE, and the
Triton grouped kernels (same recipe, same aligned rows) GEMM by GEMM; both Gluon kernels: the
128-row one (``grouped_gluon``) and the swapped decode one (``grouped_gluon_decode``, 16/32/64-row
token tiles). The Gluon consumer
promotes each 128-wide K block as ``acc + d * (a_s * b_s)`` (one FMA), the Triton kernel as
``acc + (d * a_s) * b_s``: fp32 rounding differs, so a few bf16 roundings of h (and then their
E4M3 requantisation) may land the other way; bounds are relative errors, not bits.
Routes cover: many 128-row blocks per expert (persistent CTAs walk several tiles), experts with
a 64-row half that is all padding (that consumer warpgroup skips its MMAs), empty experts and
EP-dropped pairs.
"""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.fp8.ref import dequant_block_fp8
from glmlab.kernels.moe.configs import MoEShape
from glmlab.kernels.moe.fused_grouped import (
    GLUON_CANDIDATES,
    GLUON_DECODE,
    GLUON_PREFILL,
    fused_moe_grouped,
)
from glmlab.kernels.moe.grouped_gluon import GluonConfig, gluon_down, gluon_up
from glmlab.kernels.moe.grouped_gluon_decode import gluon_decode_down, gluon_decode_up
from glmlab.kernels.moe.grouped_triton import GroupedConfig, grouped_down, grouped_up
from glmlab.kernels.moe.permute_triton import gather_quant
from glmlab.kernels.moe.ref import moe_experts_fp8_ref
from glmlab.kernels.moe.routing_triton import align_pairs
from glmlab.kernels.moe.tuner import Problem

pytestmark = pytest.mark.gpu

E = 16


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _routes(kind: str, t: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    if kind == "uniform":  # ~100 rows per expert: one block, both halves busy
        ids = torch.rand(t, E, generator=gen).topk(8, dim=1).indices
    elif kind == "skewed":  # experts 0-3 take most pairs (many blocks), 12-15 none
        logits = torch.rand(t, E, generator=gen) + torch.linspace(3, -30, E)
        ids = logits.topk(8, dim=1).indices
        ids[ids >= 12] = -1
    else:  # "sparse": 1-40 rows per expert: the second half of every block is padding
        ids = torch.rand(t, E, generator=gen).topk(8, dim=1).indices
    ids[::5, 2] = -1  # EP-dropped pairs
    return ids.to(torch.int32).cuda()


@pytest.fixture(scope="module")
def problem():
    return Problem.random(MoEShape(E, 8, 4096, 2048), "cuda", seed=7)


@pytest.fixture(scope="module", params=[("uniform", 200), ("skewed", 1024), ("sparse", 48)],
                ids=lambda k: f"{k[0]}{k[1]}")
def case(request, problem):
    kind, t = request.param
    ids = _routes(kind, t)
    x, w = problem.activations(t, seed=8)
    return problem, ids, x, w


# (Gluon up, Gluon down, Triton up, Triton down) at one alignment
KERNELS = [(*GLUON_PREFILL, GroupedConfig(128, 128, 8, 8, 3, gather_a=False),
            GroupedConfig(128, 128, 8, 8, 4))] + [
    (*GLUON_DECODE[tok], GroupedConfig(tok, 128, 8, 4, 4, swap_ab=True, gather_a=False),
     GroupedConfig(tok, 128, 8, 4, 4, swap_ab=True)) for tok in (16, 32, 64)]


def _gluon(cfg, up: bool):
    if isinstance(cfg, GluonConfig):
        return gluon_up if up else gluon_down
    return gluon_decode_up if up else gluon_decode_down


@pytest.mark.parametrize("k", KERNELS, ids=lambda k: k[0].short())
def test_gluon_up_equals_the_triton_kernel(case, k):
    p, ids, x, _ = case
    al = align_pairs(ids, E, k[0].block_m)
    a, a_s = gather_quant(x, al)
    h8, hs = _gluon(k[0], True)(a, a_s, p.w13, p.w13_scale, al, k[0], p.limit)
    h8_t, hs_t = grouped_up(a, a_s, p.w13, p.w13_scale, al, k[2], p.limit)
    torch.cuda.synchronize()
    n = int(al.num_padded.item())
    got = dequant_block_fp8(h8[:n], hs[:n], torch.float32, (1, 128))
    want = dequant_block_fp8(h8_t[:n], hs_t[:n], torch.float32, (1, 128))
    assert not got.isnan().any()
    assert _rel(got, want) < 1e-2
    same = (h8[:n].view(torch.uint8) == h8_t[:n].view(torch.uint8)).float().mean().item()
    assert same > 0.98, same  # FMA-order flips only
    pad = al.sorted_ids[:n] >= ids.numel()
    assert (got[pad] == 0).all()  # pad rows (incl. skipped halves) are defined zeros


@pytest.mark.parametrize("k", KERNELS, ids=lambda k: k[1].short())
def test_gluon_down_equals_the_triton_kernel(case, k):
    p, ids, x, w = case
    al = align_pairs(ids, E, k[0].block_m)
    a, a_s = gather_quant(x, al)
    h8, hs = grouped_up(a, a_s, p.w13, p.w13_scale, al, k[2], p.limit)
    out = _gluon(k[1], False)(h8, hs, p.w2, p.w2_scale, w, al, k[1], torch.bfloat16)
    ref = grouped_down(h8, hs, p.w2, p.w2_scale, w, al, k[3], torch.bfloat16)
    used = ((ids >= 0) & (ids < E)).reshape(-1)
    assert not out[used].isnan().any()
    assert _rel(out[used], ref[used]) < 2e-3


@pytest.mark.parametrize("cfgs", [(u, d) for u in GLUON_CANDIDATES["up"][:2]
                                  for d in GLUON_CANDIDATES["down"][:2]]
                         + list(GLUON_DECODE.values()),
                         ids=lambda c: f"{c[0].short()}-{c[1].short()}")
def test_gluon_moe_matches_w8a8_reference(case, cfgs):
    p, ids, x, w = case
    ref = moe_experts_fp8_ref(x, ids, w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit)
    out = fused_moe_grouped(x, ids, w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit, cfgs)
    assert out.dtype == x.dtype and not out.isnan().any()
    assert _rel(out, ref) < 3e-2


@pytest.mark.parametrize("cfgs", [GLUON_PREFILL, GLUON_DECODE[32]], ids=lambda c: c[0].short())
def test_gluon_is_repeatable_and_graph_capturable(problem, cfgs):
    """Same bits on every run (no atomics, deterministic order), also replayed from a graph."""
    p = problem
    ids = _routes("skewed", 1024)
    x, w = p.activations(1024, seed=9)
    run = lambda: fused_moe_grouped(x, ids, w, p.w13, p.w13_scale, p.w2, p.w2_scale,  # noqa: E731
                                    p.limit, cfgs)
    first = run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(first, run()) and torch.equal(first, out)


def test_gluon_refuses_bad_inputs(problem):
    p = problem
    ids = _routes("uniform", 32)
    x, _ = p.activations(32, seed=1)
    al64 = align_pairs(ids, E, 64)
    a, a_s = gather_quant(x, al64)
    with pytest.raises(ValueError, match="aligned to 64"):
        gluon_up(a, a_s, p.w13, p.w13_scale, al64, GluonConfig(), p.limit)
    al = align_pairs(ids, E, 128)
    h8 = torch.zeros(al.max_rows, 2048, dtype=p.w2.dtype, device="cuda")
    hs = torch.ones(al.max_rows, 16, device="cuda")
    w = torch.ones(32, 8, device="cuda")
    with pytest.raises(ValueError, match="shared memory"):  # down's bf16 epilogue: 3 stages
        gluon_down(h8, hs, p.w2, p.w2_scale, w, al, GluonConfig(stages=4), torch.bfloat16)
    with pytest.raises(ValueError, match="as a pair"):
        fused_moe_grouped(x, ids, w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit,
                          (GLUON_PREFILL[0], GroupedConfig(128, 128, 8, 8, 4)))
