"""In-place KDA window recurrence + gated head norm (kernels/decode/kda_window_triton.py) against
kernels/decode/ref.py (which runs kda.ref.kda_recurrent_ref), fp32 under the CPU interpreter."""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.decode.kda_window_triton import kda_window
from glmlab.kernels.decode.ref import kda_window_ref
from glmlab.kernels.kda.ref import l2norm

DEV = "cuda" if torch.cuda.is_available() else "cpu"
H, K = 2, 16


def _inputs(n_seq, n, seed):
    g = torch.Generator().manual_seed(seed)
    t = n_seq * n
    q = l2norm(torch.randn(t, H, K, generator=g)) * K**-0.5
    k = l2norm(torch.randn(t, H, K, generator=g))
    v = torch.randn(t, H, K, generator=g)
    gg = -5 * torch.rand(t, H, K, generator=g)
    beta = torch.rand(t, H, generator=g)
    state = torch.randn(n_seq + 3, H, K, K, generator=g) * 0.1
    slots = torch.randperm(n_seq + 3, generator=g)[:n_seq]
    gate = torch.randn(t, H * K + 3, generator=g)[:, 3:]
    w = torch.randn(K, generator=g) * 0.1 + 1
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
    got = kda_window(q, k, v, g, beta, state, slots, gate, w, 1e-5, store, block_v=block_v)
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
