"""The CUDA-core GEMV kind of the block-FP8 GEMM (kernels/fp8/gemv_triton.py) against the torch
recipe in kernels/fp8/ref.py, under the CPU interpreter: 1..4 tokens, K and N not multiples of the
program's block (nor of 128), split-K with the ticket reduction, the residual epilogue, bf16 and
fp32 activations quantised in the prologue or passed in E4M3; and the rule that picks it.
"""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.fp8.gemm_configs import GEMV_MAX_M, GemmConfig, choose_config, rule_config
from glmlab.kernels.fp8.gemm_triton import linear_fp8
from glmlab.kernels.fp8.ref import linear_fp8_ref, quant_act_fp8, quant_block_fp8
from glmlab.kernels.fused.tickets import ticket_counters

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter sums the same fp32 products in another order than torch; on the GPU the bf16
# output may also land one ulp away (tests/kernels/fused/test_decode_kernels_bf16_gpu.py).
TOL = {torch.float32: 2e-5 if DEV == "cpu" else 1e-4, torch.bfloat16: 1e-2}


def gemv(bm, bn, split, bk=256, fuse=True, warps=4):
    return GemmConfig(bm, bn, split, swap_ab=False, fuse_quant=fuse, num_warps=warps,
                      num_stages=1, block_k=bk, kind="gemv")


def _problem(m, n, k, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 3).to(dtype)
    w, s = quant_block_fp8(torch.randn(n, k, generator=g) / k**0.5)
    r = torch.randn(m, n, generator=g).to(dtype)
    return x.to(DEV), w.to(DEV), s.to(DEV), r.to(DEV)


def _rel(got, want):
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


# N = 200 (not a multiple of block_n 32 or 64, nor of 128); K = 700 (not a multiple of
# block_k 256 / 512 nor of 128: the last step has a partial scale group and empty groups).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,cfg", [
    (1, gemv(1, 32, 1)),
    (1, gemv(1, 64, 2, bk=512)),  # two K steps of 512, one per split
    (2, gemv(2, 32, 3)),  # 3 steps of 256 over 3 splits
    (3, gemv(4, 32, 2, bk=512, warps=8)),  # a padded token row
    (4, gemv(4, 64, 4)),  # 3 steps over 4 splits: one split adds an all-zero partial
    (4, gemv(2, 32, 2)),  # block_m < M: two M blocks, each its own ticket
])
@pytest.mark.parametrize("residual", [False, True])
def test_gemv_matches_reference(m, cfg, dtype, residual):
    x, w, s, r = _problem(m, 200, 700, seed=m + 10 * cfg.split_k, dtype=dtype)
    r = r if residual else None
    got = linear_fp8(x, w, s, residual=r, config=cfg)
    assert got.dtype == dtype and got.shape == (m, 200)
    assert _rel(got, linear_fp8_ref(x, w, s, residual=r)) < TOL[dtype]
    if cfg.split_k > 1:  # every ticket counter was handed back
        assert int(ticket_counters(x.device, 1).abs().sum()) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_with_prequantised_activations(dtype):
    """fuse_quant=False: linear_fp8 quantises first (quant_act_fp8_triton), or the caller passes
    E4M3 with its scales (as the fused SwiGLU does)."""
    x, w, s, r = _problem(3, 130, 384, seed=5, dtype=dtype)
    want = linear_fp8_ref(x, w, s, residual=r)
    cfg = gemv(4, 32, 2, fuse=False)
    assert _rel(linear_fp8(x, w, s, residual=r, config=cfg), want) < TOL[dtype]
    xq, xs = quant_act_fp8(x)
    got = linear_fp8(xq, w, s, x_scale=xs, residual=r, out_dtype=dtype, config=cfg)
    assert _rel(got, want) < TOL[dtype]


def test_gemv_scales_each_group_by_its_own_scales():
    """Channel groups with very different magnitudes (activations and weights): a kernel that
    applied one group's scale to another's partial sum would be far off."""
    x, w, s, _ = _problem(2, 64, 512, seed=3, dtype=torch.float32)
    x = x * torch.tensor([1e-3, 1.0, 30.0, 0.2], device=DEV).repeat_interleave(128)
    w, s = quant_block_fp8(torch.randn(64, 512).to(DEV) * torch.tensor(
        [5.0, 1e-2, 1.0, 1e2], device=DEV).repeat_interleave(128))
    got = linear_fp8(x, w, s, config=gemv(2, 16, 1, bk=512))
    assert _rel(got, linear_fp8_ref(x, w, s)) < TOL[torch.float32]


def test_gemv_split_k_is_bitwise_stable():
    x, w, s, _ = _problem(2, 96, 1024, seed=4, dtype=torch.float32)
    cfg = gemv(2, 32, 4)
    a, b = linear_fp8(x, w, s, config=cfg), linear_fp8(x, w, s, config=cfg)
    assert torch.equal(a, b)


def test_rule_picks_the_gemv_up_to_gemv_max_m_only():
    for n, k in ((8192, 4096), (4096, 16384), (24576, 4096), (2048, 4096), (16384, 1536)):
        for m in range(1, GEMV_MAX_M + 1):
            cfg = choose_config(m, n, k)
            assert cfg.kind == "gemv" and cfg.block_m >= m and cfg.block_k % 128 == 0, cfg
            assert 8 * cfg.split_k * m * n <= n * k  # partials well under the weight bytes
        assert choose_config(GEMV_MAX_M + 1, n, k).kind == "mma"
        assert rule_config(64, n, k).kind == "mma"


def test_gemv_config_is_validated():
    with pytest.raises(ValueError, match="GEMV"):
        gemv(3, 32, 1)  # block_m must be a power of two
    with pytest.raises(ValueError, match="GEMV"):
        gemv(1, 32, 1, bk=200)  # whole scale groups per step
    with pytest.raises(ValueError, match="block_k"):
        GemmConfig(16, 64, 1, swap_ab=True, fuse_quant=True, block_k=256)  # mma: 128 only
    with pytest.raises(ValueError, match="kind"):
        GemmConfig(16, 64, 1, swap_ab=True, fuse_quant=True, kind="wgmma")
