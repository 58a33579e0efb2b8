"""The persistent grouped kernels under the CPU interpreter, against the unfused path and torch.

FP8 dots are exact under the interpreter (fp16 upcast), so the fused gate_up epilogue must give
the unfused path's bits (previous GEMM kernel at BLOCK_K 128, bf16 h, ``swiglu_quant``), and the
whole MoE must equal the fp32 W8A8 reference up to its bf16 roundings. Tiny widths (D = I = 256).
"""

from __future__ import annotations

import sys

import pytest
import torch

from glmlab.kernels.fp8.quant_triton import quant_act_fp8_triton
from glmlab.kernels.fp8.ref import quant_act_fp8
from glmlab.kernels.moe import peers
from glmlab.kernels.moe.act_triton import swiglu_quant
from glmlab.kernels.moe.configs import KernelConfig, MoEShape
from glmlab.kernels.moe.fused_grouped import DECODE, PREFILL, choose_grouped, fused_moe_grouped
from glmlab.kernels.moe.gemm_triton import moe_gemm_down, moe_gemm_up
from glmlab.kernels.moe.grouped_triton import GroupedConfig as G
from glmlab.kernels.moe.grouped_triton import grouped_down, grouped_up
from glmlab.kernels.moe.permute_triton import gather_quant
from glmlab.kernels.moe.ref import moe_experts_fp8_ref
from glmlab.kernels.moe.routing_triton import align_pairs
from glmlab.kernels.moe.tuner import Problem


@pytest.fixture(scope="module")
def case():
    p = Problem.random(MoEShape(4, 2, 256, 256), "cpu", seed=1)
    x, w = p.activations(12, seed=2)
    ids = torch.randint(0, 4, (12, 2), generator=torch.Generator().manual_seed(3))
    ids[3, 1] = -1  # another EP rank's expert
    return p, x, w, ids


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@pytest.mark.parametrize("cfg", [G(16, 128, 2, 4, 2, swap_ab=True), G(32, 128, 1, 4, 2),
                                 G(32, 128, 1, 4, 2, gather_a=False)], ids=lambda c: c.short())
def test_fused_up_and_down_equal_the_unfused_kernels(case, cfg):
    p, x, w, ids = case
    al = align_pairs(ids, 4, cfg.block_m)
    xq, xs = quant_act_fp8_triton(x)
    a, a_s = (xq, xs) if cfg.gather_a else gather_quant(x, al)
    h8, hs = grouped_up(a, a_s, p.w13, p.w13_scale, al, cfg, p.limit)
    old = KernelConfig(cfg.block_m, 64, 128, 1, 4, 2)
    q_ref, s_ref = swiglu_quant(moe_gemm_up(xq, xs, p.w13, p.w13_scale, al, old, torch.bfloat16),
                                p.limit, al.num_padded)
    n = int(al.num_padded.item())
    assert torch.equal(_bits(h8[:n]), _bits(q_ref[:n])) and torch.equal(hs[:n], s_ref[:n])
    down_cfg = G(cfg.block_m, 64, 1, 4, 2, swap_ab=cfg.swap_ab)
    out = grouped_down(h8, hs, p.w2, p.w2_scale, w, al, down_cfg, torch.float32)
    ref = moe_gemm_down(q_ref, s_ref, p.w2, p.w2_scale, w, al, old, torch.float32)
    used = ids.reshape(-1) >= 0
    torch.testing.assert_close(out[used], ref[used], rtol=1e-6, atol=1e-6)


def test_fused_moe_grouped_matches_the_w8a8_reference(case):
    p, x, w, ids = case
    xb = x.to(torch.bfloat16)
    out = fused_moe_grouped(xb, ids, w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit,
                            (G(16, 128, 1, 4, 2, swap_ab=True), G(16, 128, 1, 4, 2)))
    ref = moe_experts_fp8_ref(xb, ids, w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit)
    assert out.dtype == torch.bfloat16
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-3


def test_gather_quant_is_the_reference_on_gathered_rows(case):
    p, x, _, ids = case
    al = align_pairs(ids, 4, 16)
    q, s = gather_quant(x, al)
    n = int(al.num_padded.item())
    pair = al.sorted_ids[:n].long()
    real = pair < ids.numel()
    q_ref, s_ref = quant_act_fp8(x)
    assert torch.equal(_bits(q[:n][real]), _bits(q_ref[pair[real] // 2]))
    assert torch.equal(s[:n][real], s_ref[pair[real] // 2])
    assert (_bits(q[:n][~real]) == 0).all()


def test_bad_inputs_are_refused(case):
    p, x, w, ids = case
    al = align_pairs(ids, 4, 16)
    xq, xs = quant_act_fp8_triton(x)
    with pytest.raises(ValueError, match="block_m"):
        grouped_up(xq, xs, p.w13, p.w13_scale, al, G(32, 128, 1, 4, 2), p.limit)
    with pytest.raises(ValueError, match="block-FP8"):
        grouped_up(xq, xs, p.w13.float(), None, al, G(16, 128, 1, 4, 2), p.limit)
    with pytest.raises(ValueError, match="128 columns"):
        grouped_up(xq, xs, p.w13, p.w13_scale, al, G(16, 64, 1, 4, 2), p.limit)
    with pytest.raises(ValueError, match="warp_specialize"):
        grouped_up(xq, xs, p.w13, p.w13_scale, al, G(16, 128, 1, 4, 2, warp_specialize=True),
                   p.limit)
    with pytest.raises(ValueError, match="aligned rows"):
        grouped_up(xq, xs, p.w13, p.w13_scale, al, G(16, 128, 1, 4, 2, gather_a=False), p.limit)


def test_untuned_choice_by_rows_per_expert():
    assert choose_grouped(1, 288, 8) == DECODE and choose_grouped(8, 72, 8) == DECODE
    assert choose_grouped(8192, 288, 8) == PREFILL
    up, down = choose_grouped(1024, 288, 8)
    assert up.block_m == down.block_m


def test_sglang_peer_loads_from_its_wheel_and_matches_the_reference(case):
    wheel = peers.find_wheel(".")
    if wheel is None:
        pytest.skip("no sglang wheel under .whl/ (scripts/h200_moe.sh carries one)")
    module = peers.load_sglang(wheel)
    assert not [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]
    up72, down72, src72 = peers.sglang_configs(wheel, 72, 2048, "NVIDIA H200", "3.6.0")
    assert src72.startswith("shipped triton_") and 8192 in up72 and down72
    assert peers.sglang_configs(wheel, 288, 2048, "NVIDIA H200", "3.6.0")[0] is None
    assert peers.pick(None, 5) == peers.SGLANG_BLOCK_FP8_DEFAULT
    p, x, w, ids = case
    sg = peers.SGLangMoE(module, up72, down72, 8)  # BLOCK_M 16, TMA weights on up
    al = align_pairs(ids, 4, sg.up_cfg["BLOCK_SIZE_M"])
    xb = x.to(torch.bfloat16)
    xq, xs = quant_act_fp8_triton(xb)
    h = sg.up(xq, xs, p.w13, p.w13_scale, w, ids, al)
    y8, ys = quant_act_fp8_triton(sg.act(h, ids, al, p.limit))
    out = sg.down(y8, ys, p.w2, p.w2_scale, w, ids, al).float().view(12, 2, -1)
    out = torch.where((ids >= 0)[..., None], out, 0.0).sum(1)
    ref = moe_experts_fp8_ref(xb, ids, w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit).float()
    assert ((out - ref).norm() / ref.norm()).item() < 2e-2
