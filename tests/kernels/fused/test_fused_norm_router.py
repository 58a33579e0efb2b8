"""RMSNorm (+ residual) and router kernels (kernels/fused) against kernels/fused/ref.py, fp32 under
the CPU interpreter; the router also against transformers-style routing maths (moe.ref.route_ref
on fp32 logits) with selection compared as sets."""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.fused.norm_triton import rmsnorm
from glmlab.kernels.fused.ref import rmsnorm_ref, router_ref
from glmlab.kernels.fused.router_triton import route
from glmlab.kernels.fused.tickets import ticket_counters

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def test_rmsnorm_with_and_without_residual_on_strided_rows():
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(5, 300, generator=g).to(DEV)
    x = wide[:, 20:220]  # a column slice of a fused projection's output
    w = (torch.randn(200, generator=g) * 0.1 + 1).to(DEV)
    r = torch.randn(5, 200, generator=g).to(DEV)
    h, s = rmsnorm(x, w, 1e-5)
    assert s is x
    assert torch.allclose(h, rmsnorm_ref(x, w, 1e-5)[0], rtol=1e-6, atol=1e-6)
    h, s = rmsnorm(x, w, 1e-5, residual=r)
    hr, sr = rmsnorm_ref(x, w, 1e-5, residual=r)
    assert torch.equal(s, sr)
    assert torch.allclose(h, hr, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="weight"):
        rmsnorm(x, w[:10], 1e-5)


@pytest.mark.parametrize("t,e,d,k", [(3, 8, 64, 2), (37, 40, 512, 8)])
def test_router_matches_reference(t, e, d, k):
    g = torch.Generator().manual_seed(t)
    h = torch.randn(t, d, generator=g).to(DEV)
    w = (torch.randn(e, d, generator=g) / d**0.5).to(DEV)
    bias = (torch.randn(e, generator=g) * 0.1).to(DEV)
    weights, ids = route(h, w, bias, k, 2.5)
    ref_w, ref_ids = router_ref(h, w, bias, k, 2.5)
    order = ref_ids.sort(dim=1)
    mine = ids.long().sort(dim=1)
    assert torch.equal(mine.values, order.values)  # same experts chosen
    assert torch.allclose(weights.gather(1, mine.indices), ref_w.gather(1, order.indices),
                          rtol=1e-5, atol=1e-6)
    assert torch.allclose(weights.sum(1), torch.full((t,), 2.5, device=DEV), rtol=1e-5)
    assert int(ticket_counters(h.device, 1).abs().sum()) == 0


def test_router_rejects_mismatched_weight():
    with pytest.raises(ValueError, match="router weight"):
        route(torch.randn(2, 64, device=DEV), torch.randn(8, 32, device=DEV),
              torch.zeros(8, device=DEV), 2, 2.5)
