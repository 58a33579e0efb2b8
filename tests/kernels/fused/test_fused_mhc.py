"""mHC kernels (kernels/fused/mhc_triton.py) against the torch references in kernels/fused/ref.py.

fp32 streams under the CPU interpreter: channel splits with the ticket reduction (and without),
the previous site's write-back fused in front of the coefficients, all 20 Sinkhorn iterations,
and the collapse + RMSNorm kernel.
"""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.fused.mhc_triton import mhc_collapse_norm, mhc_mix_coefficients
from glmlab.kernels.fused.ref import (
    mhc_coefficients_ref,
    mhc_collapse_norm_ref,
    mhc_expand_ref,
)
from glmlab.kernels.fused.tickets import ticket_counters

DEV = "cuda" if torch.cuda.is_available() else "cpu"
N, ITERS, EPS, NORM_EPS = 4, 20, 1e-6, 1e-5


def _site(t, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, N, d, generator=g)
    fn = torch.randn((2 + N) * N, N * d, generator=g) * 0.5 / (N * d) ** 0.5
    base = torch.randn((2 + N) * N, generator=g) * 0.5
    scale = torch.rand(3, generator=g) + 0.5
    y = torch.randn(t, d, generator=g)
    post = 2 * torch.rand(t, N, generator=g)
    comb = torch.rand(t, N, N, generator=g)
    return [a.to(DEV) for a in (x, fn, base, scale, y, post, comb)]


def _close(a, b, tol):
    err = (a - b).abs().max() / b.abs().max()
    assert err < tol, f"max rel err {err:.2e}"


@pytest.mark.parametrize("t,d", [(3, 200), (20, 512)])
def test_coefficients_match_reference(t, d):
    x, fn, base, scale, *_ = _site(t, d, seed=t)
    xo, pre, post, comb = mhc_mix_coefficients(x, fn, base, scale, ITERS, EPS, NORM_EPS)
    assert xo is x or torch.equal(xo, x)
    for got, want in zip((pre, post, comb), mhc_coefficients_ref(x, fn, base, scale, ITERS, EPS,
                                                                  NORM_EPS), strict=True):
        _close(got, want, 1e-5)
    assert int(ticket_counters(x.device, 1).abs().sum()) == 0  # every counter handed back


def test_write_back_of_the_previous_site_fused_in_front():
    x, fn, base, scale, y, post, comb = _site(5, 256, seed=9)
    xo, pre, post2, comb2 = mhc_mix_coefficients(x, fn, base, scale, ITERS, EPS, NORM_EPS,
                                                 pending=(y, post, comb))
    want = mhc_expand_ref(x, y, post, comb)
    _close(xo, want, 1e-6)
    ref = mhc_coefficients_ref(want, fn, base, scale, ITERS, EPS, NORM_EPS)
    for got, r in zip((pre, post2, comb2), ref, strict=True):
        _close(got, r, 1e-5)
    only, *_ = mhc_mix_coefficients(x, fn, base, scale, ITERS, EPS, NORM_EPS,
                                    pending=(y, post, comb), coefficients=False)
    assert torch.equal(only, xo)


def test_sinkhorn_output_is_doubly_stochastic_like_the_reference():
    x, fn, base, scale, *_ = _site(4, 128, seed=2)
    comb = mhc_mix_coefficients(x, fn, base, scale, ITERS, EPS, NORM_EPS)[3]
    assert torch.allclose(comb.sum(-2), torch.ones(4, N, device=comb.device), atol=1e-4)
    assert torch.allclose(comb.sum(-1), torch.ones(4, N, device=comb.device), atol=1e-3)


def test_collapse_norm_matches_reference():
    x, *_ = _site(6, 200, seed=4)
    pre = torch.rand(6, N, device=DEV)
    w = torch.randn(200, device=DEV) * 0.1 + 1
    _close(mhc_collapse_norm(x, pre, w, 1e-5), mhc_collapse_norm_ref(x, pre, w, 1e-5), 1e-6)


def test_mismatched_pending_is_rejected():
    x, fn, base, scale, y, post, comb = _site(2, 128, seed=1)
    with pytest.raises(ValueError, match="pending"):
        mhc_mix_coefficients(x, fn, base, scale, ITERS, EPS, NORM_EPS, pending=(y[:1], post, comb))
