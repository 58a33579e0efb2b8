"""TileLang sparse MLA (Partial + Combine) vs the torch references.

CPU: the kernels lower for sm_90a (64-head tiles to wgmma, 16-head tiles to mma.sync) and nvcc
builds a cubin, without a GPU (docs/platform.md section 2.2). GPU: every layout, both tile widths and
both head groupings against ``sparse_mla_ref`` on the dequantised rows, stage by stage too.
"""

from __future__ import annotations

import pytest
import torch

tilelang = pytest.importorskip("tilelang")

from glmlab.kernels.dsa import sparse_mla_tilelang as sm  # noqa: E402
from glmlab.kernels.dsa.dispatch import SparseMlaConfig, choose_block  # noqa: E402
from glmlab.kernels.dsa.layout import KVFormat, MlaKVLayout  # noqa: E402
from glmlab.kernels.dsa.ref import (  # noqa: E402
    EMPTY_LSE,
    sparse_mla_combine_ref,
    sparse_mla_partial_ref,
    sparse_mla_ref,
)
from glmlab.testing.compare import assert_close  # noqa: E402


def _lower(prog) -> str:
    import tvm

    with tvm.target.Target(sm.SM90A):
        return tilelang.lower(prog, target=sm.SM90A).kernel_source


def test_partial_lowers_to_wgmma_for_64_heads():
    src = _lower(sm.partial_program(MlaKVLayout(KVFormat.FP8_SCALED, 512), 128, 64, 256))
    assert "wgmma_ss" in src and "__launch_bounds__(256" in src


def test_partial_and_combine_build_cubins():
    """nvcc -arch sm_90a without a GPU; rank 128 keeps the unrolled kernel quick to build."""
    kernel = tilelang.compile(sm.partial_program(MlaKVLayout(KVFormat.BF16, 128), 32, 16, 128),
                              target=sm.SM90A)
    assert "mma_sync" in kernel.get_kernel_source()  # 16-row GEMMs: below wgmma's 64-row minimum
    assert "sparse_mla_combine" in _lower(sm.combine_program(512))


# ------------------------------------------------------------------------------------ GPU
def gpu_inputs(t, h, rank, w, n, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, h, rank, generator=g)
    latent = torch.randn(n, rank, generator=g) * 2
    idx = torch.randint(0, n, (t, w), generator=g, dtype=torch.int32)
    idx[torch.rand(t, w, generator=g) < 0.25] = -1
    idx[t // 2] = -1  # one row selects nothing
    kv = layout.pack(latent.cuda())
    return q.cuda(), kv, idx.cuda()


def reference(q, kv, layout, idx, scale):
    rows = layout.unpack(kv)[idx.long().clamp(min=0)]
    return rows, idx >= 0, sparse_mla_ref(q, rows, idx >= 0, scale)


CASES = [
    pytest.param(fmt, block, heads, splits, width,
                 id=f"{fmt.value}-b{block}-h{heads}-s{splits}-w{width}")
    for fmt in KVFormat
    for block, heads, splits, width in [(32, 16, 1, 2112), (128, 16, 1, 2051), (128, 64, 3, 300),
                                        (32, 64, 2, 33), (128, 16, 4, 1)]
]


@pytest.fixture(scope="module")
def compiled_kernels():
    """Build every kernel this module runs at once (nvcc in parallel), not one per test."""
    jobs = [(MlaKVLayout(fmt, 512), _config(block, heads, 1)) for fmt in KVFormat
            for block, heads in [(32, 16), (128, 16), (128, 64), (32, 64)]]
    jobs += [(MlaKVLayout(KVFormat.FP8_SCALED, r), _config(32, 16, 1)) for r in (32, 64)]
    sm.precompile(jobs)


def _config(block, heads, splits):
    group = 64 if heads % 64 == 0 else 16
    return SparseMlaConfig(block, group, splits, 256 if group == 64 else 128)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,block,heads,splits,width", CASES)
def test_kernel_matches_reference(compiled_kernels, fmt, block, heads, splits, width):
    layout = MlaKVLayout(fmt, 512)
    q, kv, idx = gpu_inputs(6, heads, 512, width, 5000, layout)
    cfg = _config(block, heads, splits)
    rows, valid, ref = reference(q, kv, layout, idx, 1 / 16)
    po, pl = sm.sparse_mla_partial(q, kv, layout, idx, 1 / 16, cfg)
    ref_po, ref_pl = sparse_mla_partial_ref(q, rows, valid, 1 / 16, block, splits)
    assert_close("partial o", ref_po, po, "bf16")
    real = ref_pl > EMPTY_LSE / 2  # splits with something valid; the rest hold the sentinel
    assert torch.equal(real, pl > EMPTY_LSE / 2) and (pl[~real] == EMPTY_LSE).all()
    assert_close("partial lse", ref_pl[real], pl[real], "bf16")
    out, lse = sm.sparse_mla_combine(po, pl)
    assert_close("combine vs ref combine", sparse_mla_combine_ref(ref_po, ref_pl)[0], out, "bf16")
    assert_close("sparse mla", ref, out, "bf16")
    assert (out[3] == 0).all() and (lse[3] <= EMPTY_LSE / 2).all()


@pytest.mark.gpu
@pytest.mark.parametrize("heads,rank", [(2, 32), (20, 64), (64, 512)])
def test_fwd_pads_heads_and_uses_the_rule(compiled_kernels, heads, rank):
    layout = MlaKVLayout(KVFormat.FP8_SCALED, rank)
    q, kv, idx = gpu_inputs(5, heads, rank, 70, 400, layout, seed=1)
    out, _ = sm.sparse_mla_fwd(q, kv, layout, idx, rank**-0.5)
    assert_close("fwd", reference(q, kv, layout, idx, rank**-0.5)[2], out, "bf16")
    assert choose_block(sm.GpuArch.current(), layout, 5, heads).num_splits > 1  # exercised Combine
