"""In-place KDA window recurrence + gated head norm (kernels/decode/kda_window_triton.py) and its
chunk (matrix) form for verify windows (kernels/decode/kda_window_chunk_triton.py) against
kernels/decode/ref.py (which runs kda.ref.kda_recurrent_ref), fp32 under the CPU interpreter."""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.decode.kda_window_triton import kda_window
from glmlab.kernels.decode.ref import kda_window_ref
from glmlab.kernels.kda.ref import l2norm

DEV = "cuda" if torch.cuda.is_available() else "cpu"
H, K = 2, 16


def _inputs(n_seq, n, seed, dk=K, state_dtype=torch.float32, regime="random"):
    g = torch.Generator().manual_seed(seed)
    t = n_seq * n
    q = l2norm(torch.randn(t, H, dk, generator=g)) * dk**-0.5
    k = l2norm(torch.randn(t, H, dk, generator=g))
    v = torch.randn(t, H, dk, generator=g)
    gg = -5 * torch.rand(t, H, dk, generator=g)
    beta = torch.rand(t, H, generator=g)
    if regime == "strong":  # every channel near the gate's lower bound: G_16 ~ -80
        gg = -5 + 0.05 * torch.rand(t, H, dk, generator=g)
    elif regime == "weak":  # little decay, similar keys, beta near 1: L far from small, so
        # every power of L up to L^15 counts (with random keys and gates L^8 is negligible)
        gg = -0.05 * torch.rand(t, H, dk, generator=g)
        k = l2norm(torch.randn(1, H, dk, generator=g) + 0.3 * torch.randn(t, H, dk, generator=g))
        beta = 0.8 + 0.2 * torch.rand(t, H, generator=g)
    state = (torch.randn(n_seq + 3, H, dk, dk, generator=g) * 0.1).to(state_dtype)
    slots = torch.randperm(n_seq + 3, generator=g)[:n_seq]  # out of order, some slots unused
    gate = torch.randn(t, H * dk + 3, generator=g)[:, 3:]
    w = torch.randn(dk, generator=g) * 0.1 + 1
    return [x.to(DEV) for x in (q, k, v, gg, beta, state, slots, gate, w)]


# block_v 8: two programs per head, each with half the value columns, and the head norm as a
# second kernel (the split the real 128 x 128 heads take)
@pytest.mark.parametrize("n_seq,n,store,block_v", [(3, 1, True, None), (2, 4, True, None),
                                                   (2, 4, False, None), (3, 1, True, 8),
                                                   (2, 4, True, 8), (2, 4, False, 8)])
def test_window_matches_reference(n_seq, n, store, block_v):
    q, k, v, g, beta, state, slots, gate, w = _inputs(n_seq, n, seed=n + store)
    ref_state = state.clone()
    want = kda_window_ref(q, k, v, g, beta, ref_state, slots, gate, w, 1e-5, store)
    before = state.clone()
    got = kda_window(q, k, v, g, beta, state, slots, gate, w, 1e-5, store, block_v=block_v,
                     method="recurrent")
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert torch.allclose(state, ref_state, rtol=1e-5, atol=1e-6)
    if not store:
        assert torch.equal(state, before)  # verify leaves the committed state alone


def test_non_uniform_batch_is_refused():
    q, k, v, g, beta, state, slots, gate, w = _inputs(2, 2, seed=0)
    with pytest.raises(ValueError, match="uniform"):
        kda_window(q[:3], k[:3], v[:3], g[:3], beta[:3], state, slots, gate[:3], w, 1e-5)


def test_value_block_splits_real_heads_only():
    from glmlab.kernels.decode.kda_window_triton import value_block

    assert value_block(128, 128, 128, 16) == 32  # a 64 KB fp32 head never sits in one program
    assert value_block(16, 16, 2, 2) == 16  # no narrower slice than 32 columns
    assert value_block(64, 64, 200, 4) == 64 and value_block(64, 64, 8, 4) == 32  # fill the GPU


# Chunk form. K = 32 so a block_v = 16 split (two programs per head, the norm as a second kernel)
# still has the 16-wide tiles tl.dot needs. fp32 state: same bar as the recurrent kernel (the
# two orders of fp32 arithmetic differ by ~1e-6 here).
@pytest.mark.parametrize("n", [2, 5, 8, 16])
@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("block_v", [None, 16])
def test_chunk_matches_reference(n, store, block_v):
    q, k, v, g, beta, state, slots, gate, w = _inputs(3, n, seed=10 * n + store, dk=32)
    ref_state = state.clone()
    want = kda_window_ref(q, k, v, g, beta, ref_state, slots, gate, w, 1e-5, store)
    before = state.clone()
    got = kda_window(q, k, v, g, beta, state, slots, gate, w, 1e-5, store, block_v=block_v,
                     method="chunk")
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert torch.allclose(state, ref_state, rtol=1e-5, atol=1e-6)
    if not store:
        assert torch.equal(state, before)


@pytest.mark.parametrize("regime", ["strong", "weak"])
def test_chunk_extreme_gates_full_window(regime):
    """16 steps at the gates' extremes. Strong decay: G reaches ~-80, where e^{+-G} alone sits at
    the edge of fp32 (the kernel centres its exponents). Weak decay with similar keys: the whole
    (I + L)^-1 matters, far from the identity (the product (I - L)(I + L^2)(I + L^4)(I + L^8),
    exact in exact arithmetic, lost 5e-5 here in fp32)."""
    q, k, v, g, beta, state, slots, gate, w = _inputs(2, 16, seed=3, dk=32, regime=regime)
    ref_state = state.clone()
    want = kda_window_ref(q, k, v, g, beta, ref_state, slots, gate, w, 1e-5, True)
    got = kda_window(q, k, v, g, beta, state, slots, gate, w, 1e-5, True, method="chunk")
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert torch.allclose(state, ref_state, rtol=1e-5, atol=1e-6)


# bf16 state: both sides read the same bf16 values into fp32 (outputs keep the fp32 bar), and
# round their fp32 final states (which differ by ~1e-6) to bf16, where a value near a rounding
# boundary may land one bf16 ulp apart: at most 2^-7 of the value (8 significant bits). The bar
# is that ulp, not fewer flips: Triton's CPU interpreter truncates fp32 -> bf16 where torch (and
# the GPU) round to nearest, so here about half the stored values sit one ulp below the reference.
@pytest.mark.parametrize("n,block_v", [(2, None), (8, 16)])
def test_chunk_bf16_state(n, block_v):
    q, k, v, g, beta, state, slots, gate, w = _inputs(3, n, seed=n, dk=32,
                                                      state_dtype=torch.bfloat16)
    ref_state = state.clone()
    want = kda_window_ref(q, k, v, g, beta, ref_state, slots, gate, w, 1e-5, True)
    got = kda_window(q, k, v, g, beta, state, slots, gate, w, 1e-5, True, block_v=block_v,
                     method="chunk")
    assert state.dtype == torch.bfloat16
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert torch.allclose(state.float(), ref_state.float(), rtol=2**-7, atol=1e-6)


def test_dispatch_recurrent_by_default_chunk_when_asked(monkeypatch):
    from glmlab.kernels.decode import kda_window_chunk_triton as chunk
    from glmlab.kernels.decode.kda_window_triton import window_method

    calls = []
    real = chunk.launch_chunk
    monkeypatch.setattr(chunk, "launch_chunk", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    for n, method, want_chunk in [(1, None, False), (8, None, False), (2, "chunk", True),
                                  (16, "chunk", True), (8, "recurrent", False), (1, "chunk", True)]:
        calls.clear()
        q, k, v, g, beta, state, slots, gate, w = _inputs(2, n, seed=n)
        ref_state = state.clone()
        want = kda_window_ref(q, k, v, g, beta, ref_state, slots, gate, w, 1e-5, True)
        got = kda_window(q, k, v, g, beta, state, slots, gate, w, 1e-5, True, method=method)
        assert bool(calls) == want_chunk, (n, method)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
        assert torch.allclose(state, ref_state, rtol=1e-5, atol=1e-6)
    assert {window_method(n) for n in (1, 2, 8, 16, 17)} == {"recurrent"}
    with pytest.raises(ValueError, match="16"):
        window_method(8, "chunk", dk=8)  # tl.dot needs 16-wide tiles
    with pytest.raises(ValueError, match="method"):
        window_method(8, "wy")
