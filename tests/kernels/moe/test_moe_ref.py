"""The MoE references agree with each other: alignment, the W8A8 recipe, SwiGLU + quant."""

from __future__ import annotations

import torch

from glmlab.kernels.fp8.ref import dequant_block_fp8, quant_act_fp8, quant_block_fp8
from glmlab.kernels.moe.ref import (
    clamped_swiglu,
    moe_align_ref,
    moe_experts_fp8_ref,
    moe_experts_ref,
    swiglu_quant_ref,
)


def test_align_ref_sorts_pads_and_skips():
    ids = torch.tensor([[2, 0], [2, -1], [5, 2], [0, 7]])  # 7 >= E and -1 are skipped
    sorted_ids, experts, n = moe_align_ref(ids, num_experts=6, block_m=4)
    assert n == 12 and experts.tolist() == [0, 2, 5]
    assert sorted_ids.tolist() == [1, 6, 8, 8, 0, 2, 5, 8, 4, 8, 8, 8]


def test_swiglu_quant_ref_is_swiglu_then_group_quant():
    h = torch.randn(5, 2 * 160, dtype=torch.bfloat16) * 8
    q, s = swiglu_quant_ref(h, 10.0)
    y = clamped_swiglu(h[:, :160], h[:, 160:], 10.0)
    assert y.dtype == torch.bfloat16 and s.shape == (5, 2)
    deq = dequant_block_fp8(q, s, torch.float32, (1, 128))
    step = s.repeat_interleave(128, dim=1)[:, :160] * 2 ** -9  # E4M3 subnormal spacing
    assert ((deq - y.float()).abs() <= y.float().abs() * 2 ** -4 + step).all()


def test_fp8_ref_tracks_weight_only_ref_within_activation_rounding():
    torch.manual_seed(0)
    e, d, i, t, a = 4, 256, 128, 24, 2
    w13, s13 = quant_block_fp8(torch.randn(e, 2 * i, d) / 16)
    w2, s2 = quant_block_fp8(torch.randn(e, d, i) / 12)
    x = torch.randn(t, d)
    ids = torch.stack([torch.randperm(e)[:a] for _ in range(t)])
    w = torch.rand(t, a)
    ref = moe_experts_ref(x, ids, w, w13, w2, 10.0, s13, s2)
    fp8 = moe_experts_fp8_ref(x, ids, w, w13, s13, w2, s2, 10.0)
    rel = ((fp8 - ref).norm() / ref.norm()).item()
    assert 1e-3 < rel < 6e-2  # E4M3 activations: ~3% per quantisation, and never exact


def test_fp8_ref_skips_other_ranks_pairs():
    torch.manual_seed(1)
    w13, s13 = quant_block_fp8(torch.randn(3, 256, 128) / 16)
    w2, s2 = quant_block_fp8(torch.randn(3, 128, 128) / 12)
    x = torch.randn(6, 128)
    ids = torch.tensor([[0, -1]] * 6)
    w = torch.rand(6, 2)
    full = moe_experts_fp8_ref(x, ids, w, w13, s13, w2, s2, 10.0)
    only = moe_experts_fp8_ref(x, ids[:, :1], w[:, :1], w13, s13, w2, s2, 10.0)
    torch.testing.assert_close(full, only, rtol=0, atol=0)
    xq, xs = quant_act_fp8(x)
    assert xs.shape == (6, 1)
