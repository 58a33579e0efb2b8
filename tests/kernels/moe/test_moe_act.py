"""Fused SwiGLU + FP8 quant, the plain SwiGLU, activation quant and combine vs torch (interpreter).

On the CPU the interpreter's fp32 -> bf16 / e4m3 casts are made exact (fp8.interpret_casts), so
the comparisons are bitwise here too; the GPU test repeats them with the hardware casts.
"""

from __future__ import annotations

import torch

from glmlab.kernels.fp8.quant_triton import quant_act_fp8_triton
from glmlab.kernels.fp8.ref import quant_act_fp8
from glmlab.kernels.moe.act_triton import combine, swiglu, swiglu_quant
from glmlab.kernels.moe.ref import clamped_swiglu, swiglu_quant_ref


def _bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)


def test_swiglu_quant_bitwise_equals_unfused_ref():
    gen = torch.Generator().manual_seed(0)
    h = (torch.randn(9, 2 * 200, generator=gen) * 6).to(torch.bfloat16)  # past the clamp, ragged I
    h[3] = 0  # an all-zero row: scale floor 1e-12 / 448
    num_rows = torch.tensor([7], dtype=torch.int32)
    q, s = swiglu_quant(h, 10.0, num_rows)
    q_ref, s_ref = swiglu_quant_ref(h[:7], 10.0)
    assert torch.equal(_bits(q[:7]), _bits(q_ref)) and torch.equal(s[:7], s_ref)
    assert s.shape == (9, 2) and torch.isnan(s[7:]).all()  # rows past num_rows: never written
    y = swiglu(h, 10.0, num_rows)
    assert torch.equal(y[:7], clamped_swiglu(h[:7, :200], h[:7, 200:], 10.0))
    q2, s2 = quant_act_fp8_triton(y, 128, num_rows)  # the unfused kernel pair: same bits
    assert torch.equal(_bits(q2[:7]), _bits(q)[:7]) and torch.equal(s2[:7], s[:7])


def test_swiglu_fp32_matches_ref():
    h = torch.randn(5, 2 * 96) * 6
    y = swiglu(h, 10.0)
    torch.testing.assert_close(y, clamped_swiglu(h[:, :96], h[:, 96:], 10.0), rtol=1e-6, atol=1e-7)


def test_quant_act_fp8_triton_matches_ref():
    x = torch.randn(6, 384, dtype=torch.bfloat16) * torch.logspace(-3, 3, 6)[:, None]
    q, s = quant_act_fp8_triton(x)
    q_ref, s_ref = quant_act_fp8(x)
    assert torch.equal(_bits(q), _bits(q_ref)) and torch.equal(s, s_ref)


def test_combine_sums_slots_and_skips_foreign_pairs():
    pair = torch.randn(4 * 3, 40)
    ids = torch.tensor([[0, 1, 2], [2, -1, 1], [5, 0, 1], [1, 1, 1]])  # -1 and 5 (>= E) skipped
    out = combine(pair, ids, num_experts=3)
    keep = ((ids >= 0) & (ids < 3)).float()
    torch.testing.assert_close(out, (pair.view(4, 3, 40) * keep[..., None]).sum(1))
