"""GPU checks at GLM-5.3-Flash widths (D 4096, I 2048, top-8), with the hardware casts and dots.

Bitwise where the design promises it (fused SwiGLU + quant = the unfused torch path; activation
quantisation; alignment). The grouped GEMMs accumulate on tensor cores (FP8 wgmma is not
fp32-exact; DeepSeek-V3 reports ~14 bits on H800): a few bf16 roundings of the gate_up output
land the other way and the second FP8 quantisation amplifies them, 0.06-0.4% relative error of
the whole MoE against the fp32-accumulated reference on H200 (2026-11-30; ~1% before the scales
followed torch's CUDA division). The end-to-end bound is 3e-2; the gate_up GEMM alone is checked
tighter.
"""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.fp8.quant_triton import quant_act_fp8_triton
from glmlab.kernels.fp8.ref import dequant_block_fp8, quant_act_fp8
from glmlab.kernels.moe.act_triton import swiglu, swiglu_quant
from glmlab.kernels.moe.configs import DEFAULT_CONFIG, KernelConfig, MoEShape
from glmlab.kernels.moe.fused_moe import fused_moe
from glmlab.kernels.moe.gemm_triton import moe_gemm_up
from glmlab.kernels.moe.ref import (
    clamped_swiglu,
    moe_align_ref,
    moe_experts_fp8_ref,
    route_ref,
    swiglu_quant_ref,
)
from glmlab.kernels.moe.routing_triton import align_pairs, route_topk
from glmlab.kernels.moe.samples import uniform_routes
from glmlab.kernels.moe.tuner import Problem

pytestmark = pytest.mark.gpu


def _mismatch(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.dtype == torch.float8_e4m3fn:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return (a != b).float().mean().item()


def test_fused_swiglu_quant_is_bitwise_the_unfused_path():
    gen = torch.Generator("cuda").manual_seed(0)
    h = (torch.randn(4096, 4096, generator=gen, device="cuda") * 8).to(torch.bfloat16)
    y = swiglu(h, 10.0)
    y_ref = clamped_swiglu(h[:, :2048], h[:, 2048:], 10.0)
    assert torch.equal(y, y_ref), f"bf16 activation differs at {_mismatch(y, y_ref):.2e}"
    q, s = swiglu_quant(h, 10.0)
    q_ref, s_ref = swiglu_quant_ref(h, 10.0)  # torch CUDA ops in bf16, then group quant
    assert torch.equal(s, s_ref), f"scales differ at {_mismatch(s, s_ref):.2e}"
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), _mismatch(q, q_ref)


def test_activation_quant_is_bitwise_the_reference():
    x = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16) * 3
    q, s = quant_act_fp8_triton(x)
    q_ref, s_ref = quant_act_fp8(x)
    assert torch.equal(s, s_ref), f"scales differ at {_mismatch(s, s_ref):.2e}"
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), _mismatch(q, q_ref)


def test_routing_and_alignment_at_288_experts():
    gen = torch.Generator("cuda").manual_seed(1)
    logits = torch.randn(1024, 288, generator=gen, device="cuda") * 2
    bias = torch.randn(288, generator=gen, device="cuda") * 0.1
    w, ids = route_topk(logits, bias, 8, 2.5)
    w_ref, ids_ref = route_ref(logits, bias, 8, 2.5)
    order, order_ref = ids.long().sort(1), ids_ref.sort(1)
    assert (order.values == order_ref.values).all(1).float().mean() > 0.999
    torch.testing.assert_close(w.gather(1, order.indices), w_ref.gather(1, order_ref.indices),
                               rtol=1e-5, atol=1e-6)
    al = align_pairs(ids, 288, 64)
    sorted_ref, experts_ref, n = moe_align_ref(ids.long(), 288, 64)
    assert al.num_padded.item() == n
    assert torch.equal(al.sorted_ids[:n].long(), sorted_ref.cuda())
    assert torch.equal(al.expert_ids[:n // 64].long(), experts_ref.cuda())


@pytest.mark.parametrize("cfg", [DEFAULT_CONFIG, KernelConfig(16, 128, 128, 16, 4, 3),
                                 KernelConfig(128, 256, 128, 16, 8, 3)])
def test_fused_moe_matches_w8a8_reference_at_real_width(cfg):
    p = Problem.random(MoEShape(16, 8, 4096, 2048), "cuda", seed=2)
    ids = uniform_routes(16, 8, 200, 1, seed=3)[0].cuda()
    ids[::7, 3] = -1  # EP-dropped pairs
    x, w = p.activations(200, seed=4)
    out = fused_moe(x, ids, w, p.w13, p.w2, p.limit, p.w13_scale, p.w2_scale, configs=(cfg, cfg))
    ref = moe_experts_fp8_ref(x, ids, w, p.w13, p.w13_scale, p.w2, p.w2_scale, p.limit)
    rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert not out.isnan().any() and rel < 3e-2, rel
    al = align_pairs(ids, 16, cfg.block_m)
    xq, xs = quant_act_fp8_triton(x)
    h = moe_gemm_up(xq, xs, p.w13, p.w13_scale, al, cfg, torch.float32)
    n = int(al.num_padded.item())
    pair = al.sorted_ids[:n].long()
    rows = pair < ids.numel()
    x_deq = dequant_block_fp8(xq, xs, torch.float32, (1, 128))
    experts = al.expert_ids[:n // cfg.block_m].long().repeat_interleave(cfg.block_m)
    h_ref = torch.zeros_like(h[:n])
    for e in range(16):
        sel = rows & (experts == e)
        w_e = dequant_block_fp8(p.w13[e], p.w13_scale[e], torch.float32)
        h_ref[sel] = x_deq[pair[sel] // 8] @ w_e.t()
    h_rel = ((h[:n][rows] - h_ref[rows]).norm() / h_ref[rows].norm()).item()
    assert h_rel < 5e-3, f"gate_up GEMM relative error {h_rel:.2e}"
    unfused = fused_moe(x, ids, w, p.w13, p.w2, p.limit, p.w13_scale, p.w2_scale,
                        configs=(cfg, cfg), fuse_act_quant=False)
    assert torch.equal(out, unfused)
