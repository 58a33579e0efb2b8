"""``torch._scaled_mm``'s block-wise FP8 GEMM as a ``linear_fp8`` kind (kernels/fp8/scaled_mm.py).

On the CPU: the scale layouts against explicit expected strides and storage, torch's own shape
and layout check of them on the meta device, and that a call the GPU path cannot take is refused
(explicit config) or sent to the rule (table pick), and recorded as failed by the tuner. On an
sm_90 GPU: the product against ``ref.linear_fp8_ref``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from glmlab.kernels.fp8 import gemm_triton, scaled_mm
from glmlab.kernels.fp8.gemm_configs import GemmConfig, GemmTable, scaled_mm_config
from glmlab.kernels.fp8.gemm_triton import linear_fp8
from glmlab.kernels.fp8.ref import FP8, linear_fp8_ref, quant_block_fp8
from glmlab.kernels.fp8.tuner import tune_shape
from glmlab.kernels.moe.timing import WallTimer


def test_scale_layouts():
    x_scale = torch.arange(15, dtype=torch.float32).view(3, 5)  # M = 3, K = 640
    w_scale = 100 + torch.arange(10, dtype=torch.float32).view(2, 5)  # N = 256
    a, b = scaled_mm.prepare_scales(x_scale, w_scale, v2=True)
    # scale_a: the same [M, K/128] values stored group-major (stride (1, M))
    assert a.shape == (3, 5) and a.stride() == (1, 3) and torch.equal(a, x_scale)
    assert a.untyped_storage().nbytes() == 15 * 4
    assert torch.equal(torch.as_strided(a, (15,), (1,)), x_scale.t().flatten())
    # scale_b: [L4, N/128] with stride (1, L4), L4 = 8: each weight block row padded to 8
    assert b.shape == (8, 2) and b.stride() == (1, 8)
    padded = torch.zeros(2, 8)
    padded[:, :5] = w_scale
    assert torch.equal(torch.as_strided(b, (16,), (1,)), padded.flatten())
    _, b1 = scaled_mm.prepare_scales(x_scale, w_scale, v2=False)
    assert b1.shape == (5, 2) and b1.stride() == (1, 8) and torch.equal(b1, w_scale.t())


@pytest.mark.skipif(not scaled_mm.has_v2(), reason="torch without torch.nn.functional.scaled_mm")
@pytest.mark.parametrize("m", [1, 3, 128])
def test_meta_registration_accepts_the_prepared_scales_only(m):
    n, k = 256, 640
    meta = dict(device="meta")
    x = torch.empty(m, k, dtype=FP8, **meta)
    w = torch.empty(n, k, dtype=FP8, **meta)
    xs, ws = torch.empty(m, k // 128, **meta), torch.empty(n // 128, k // 128, **meta)
    a, b = scaled_mm.prepare_scales(xs, ws, v2=True)
    y = F.scaled_mm(x, w.t(), a, F.ScalingType.BlockWise1x128, b,
                    F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    if m > 1:  # row-major activation scales are refused (at M = 1 both layouts coincide)
        with pytest.raises(RuntimeError, match="blockwise"):
            F.scaled_mm(x, w.t(), xs, F.ScalingType.BlockWise1x128, b,
                        F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="blockwise"):  # unpadded K/128 rows
        F.scaled_mm(x, w.t(), a, F.ScalingType.BlockWise1x128, ws.t(),
                    F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)


@pytest.mark.parametrize("m", [1, 3, 4, 6])
def test_scaled_mm_fp8_pads_m_and_passes_torchs_checks_on_meta(m):
    """The whole call on the meta device: M padded to a multiple of 4 (cuBLASLt refused M = 1
    on the H200), torch's shape and layout checks, the pad rows dropped again."""
    meta = dict(device="meta")
    y = scaled_mm.scaled_mm_fp8(torch.empty(m, 384, dtype=FP8, **meta),
                                torch.empty(m, 3, **meta),
                                torch.empty(256, 384, dtype=FP8, **meta),
                                torch.empty(2, 3, **meta),
                                residual=torch.empty(m, 256, dtype=torch.bfloat16, **meta))
    assert y.shape == (m, 256) and y.dtype == torch.bfloat16 and y.is_contiguous()


def test_v1_meta_registration_accepts_the_v1_scales():
    x = torch.empty(4, 384, dtype=FP8, device="meta")
    w = torch.empty(256, 384, dtype=FP8, device="meta")
    a, b = scaled_mm.prepare_scales(torch.empty(4, 3, device="meta"),
                                    torch.empty(2, 3, device="meta"), v2=False)
    assert torch._scaled_mm(x, w.t(), a, b, out_dtype=torch.bfloat16).shape == (4, 256)


def test_config_is_one_value_and_round_trips():
    cfg = scaled_mm_config()
    assert cfg == scaled_mm_config() and cfg.short() == "scaled_mm" and cfg.smem_bytes(2) == 0
    assert GemmTable.from_json(GemmTable({(256, 384): {1: cfg}}).to_json("x")).entries == {
        (256, 384): {1: cfg}}
    with pytest.raises(ValueError, match="no tiles"):
        GemmConfig(64, 128, 2, swap_ab=False, fuse_quant=False, kind="scaled_mm")


def _problem(m, n, k, device="cpu", dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).to(device, dtype)
    w, s = quant_block_fp8(torch.randn(n, k, generator=g).to(device) / k**0.5)
    return x, w, s, torch.randn(m, n, generator=g).to(device, dtype)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_unsupported_call_is_refused_or_sent_to_the_rule(monkeypatch):
    x, w, s, _ = _problem(2, 256, 384, dtype=torch.float32)
    with pytest.raises(ValueError, match="sm_90"):
        linear_fp8(x, w, s, config=scaled_mm_config())
    table = GemmTable({(256, 384): {1: scaled_mm_config()}})
    monkeypatch.setattr(gemm_triton, "cached_table", lambda device: table)
    got = linear_fp8(x, w, s)  # the table's pick cannot run here: the rule's does
    want = linear_fp8_ref(x, w, s)
    assert float((got - want).abs().max() / want.abs().max()) < 2e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_tuner_records_a_refused_scaled_mm_and_goes_on():
    gemv = GemmConfig(4, 32, 2, swap_ab=False, fuse_quant=True, num_stages=1, block_k=256,
                      kind="gemv")
    res = tune_shape(3, 256, 384, WallTimer(), device="cpu", dtype=torch.float32,
                     configs=[scaled_mm_config(), gemv])
    assert [t.config for t in res.timings] == [gemv] and res.best_rel_err < 1e-2
    assert res.best_of("scaled_mm") is None and res.best_of("gemv").config == gemv
    assert res.failure_of(scaled_mm_config()).startswith("scaled_mm: ValueError")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 4, 32, 128, 300])
def test_scaled_mm_matches_reference_gpu(m):
    """Rounded to bf16 as the reference is; the bar of the other kinds' bf16 GPU tests."""
    reason = scaled_mm.unsupported_reason(4096, 4096, (128, 128), torch.device("cuda"),
                                          torch.bfloat16)
    if reason:
        pytest.skip(reason)
    x, w, s, r = _problem(m, 4096, 4096, "cuda")
    want = linear_fp8_ref(x, w, s, residual=r).float()
    got = linear_fp8(x, w, s, residual=r, config=scaled_mm_config()).float()
    assert float((got - want).abs().max() / want.abs().max()) < 2e-2
    assert float((got - want).norm() / want.norm()) < 2e-3
