"""The Triton routed-expert MoE against the references (CPU interpreter, small shapes).

Block-FP8: ``fused_moe`` must equal ``moe_experts_fp8_ref`` (the W8A8 recipe); on the CPU the
interpreter's casts are exact and fp8 dots run in fp16, so the two agree bit for bit here.
Plain weights: fp32 against ``moe_experts_ref``.
"""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.fp8.ref import quant_block_fp8
from glmlab.kernels.moe.configs import KernelConfig
from glmlab.kernels.moe.fused_moe import fused_moe
from glmlab.kernels.moe.ref import moe_experts_fp8_ref, moe_experts_ref


def _problem(e, d, i, t, a, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, d, generator=gen) * torch.exp2(torch.randint(-3, 4, (t, 1), generator=gen))
    ids = torch.stack([torch.randperm(e, generator=gen)[:a] for _ in range(t)])
    w = torch.rand(t, a, generator=gen) + 0.1
    w13 = torch.randn(e, 2 * i, d, generator=gen) / d ** 0.5
    w2 = torch.randn(e, d, i, generator=gen) / i ** 0.5
    return x, ids, w, w13, w2


def _fp8(w, seed):
    q, s = quant_block_fp8(w)
    gen = torch.Generator().manual_seed(seed)
    return q, s * torch.exp2(torch.randint(-4, 3, s.shape, generator=gen).float())  # non-uniform


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("cfg", [
    KernelConfig(16, 64, 128, 4, 4, 2),
    KernelConfig(32, 256, 64, 1, 4, 2),  # BLOCK_N spans two scale blocks, BLOCK_K half of one
])
def test_fp8_equals_w8a8_reference(cfg):
    x, ids, w, w13, w2 = _problem(e=5, d=256, i=128, t=11, a=3, seed=0)
    (q13, s13), (q2, s2) = _fp8(w13, 1), _fp8(w2, 2)
    xb = x.to(torch.bfloat16)
    ids[2, 1] = -1  # an EP-dropped pair
    out = fused_moe(xb, ids, w, q13, q2, 10.0, s13, s2, configs=(cfg, cfg))
    ref = moe_experts_fp8_ref(xb, ids, w, q13, s13, q2, s2, 10.0)
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    assert _rel(out, ref) < 1e-3


def test_unfused_act_quant_gives_the_same_result():
    x, ids, w, w13, w2 = _problem(e=4, d=128, i=128, t=6, a=2, seed=3)
    (q13, s13), (q2, s2) = _fp8(w13, 4), _fp8(w2, 5)
    xb = x.to(torch.bfloat16)
    cfg = (KernelConfig(16, 128, 128, 1, 4, 2),) * 2
    fused = fused_moe(xb, ids, w, q13, q2, 10.0, s13, s2, configs=cfg)
    unfused = fused_moe(xb, ids, w, q13, q2, 10.0, s13, s2, configs=cfg, fuse_act_quant=False)
    assert torch.equal(fused, unfused)


def test_plain_fp32_matches_weight_only_ref():
    x, ids, w, w13, w2 = _problem(e=6, d=64, i=32, t=9, a=2, seed=6)  # K < BLOCK_K: masked tails
    out = fused_moe(x, ids, w, w13, w2, 10.0, configs=(KernelConfig(16, 32, 64, 1, 4, 2),) * 2)
    ref = moe_experts_ref(x, ids, w, w13, w2, 10.0)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_rejects_mismatched_block_m():
    x, ids, w, w13, w2 = _problem(e=2, d=64, i=32, t=2, a=1, seed=7)
    with pytest.raises(ValueError, match="BLOCK_SIZE_M"):
        fused_moe(x, ids, w, w13, w2, 10.0, configs=(KernelConfig(16), KernelConfig(32)))
