"""The chunk (matrix) form of the KDA verify window (kernels/decode/kda_window_chunk_triton.py) at
real widths on the GPU: 132 sequences x 8 tokens, 64 heads of K = V = 128, bf16 activations,
fp32 and bf16 state; against the recurrent kernel on every sequence and the torch reference
(kernels/decode/ref.py) on a sample of them.

Bars: outputs are bf16 (rounded once before the norm, once after, as the reference does), where
fp32 summation order may move a value one bf16 ulp (up to 2^-7 of it) at either rounding, so a
few ulps: 2e-2 of the largest output. fp32 states: the chunk dots run as
tf32x3 (or ieee), within ~1e-6 of fp32; the bar is 1e-4 of the largest entry, as the other
real-width window test. bf16 states: both sides round fp32 values within ~1e-6 of each other to
bf16, one ulp apart at most (2^-7 of the value).
"""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.decode.kda_window_triton import kda_window
from glmlab.kernels.decode.ref import kda_window_ref
from glmlab.kernels.kda.ref import l2norm

pytestmark = pytest.mark.gpu
BF = torch.bfloat16
N_SEQ, N, H, K = 132, 8, 64, 128
SAMPLE = [0, 7, 64, 131]  # sequences checked against the torch reference


def _rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def _inputs(state_dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = N_SEQ * N

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g)

    q = l2norm(randn(t, H, K)) * K**-0.5
    k = l2norm(randn(t, H, K))
    v = randn(t, H, K).to(BF)
    gg = -5 * torch.sigmoid(2 * randn(t, H, K) - 2)  # lower_bound * sigmoid(..): most decay weak
    beta = torch.sigmoid(randn(t, H)).to(BF)
    slots = torch.randperm(N_SEQ + 4, device="cuda", generator=g)[:N_SEQ]
    state = (randn(N_SEQ + 4, H, K, K) * 0.05).to(state_dtype)
    gate = randn(t, H * K).to(BF)
    nw = (randn(K) * 0.1 + 1).to(BF)
    return q, k, v, gg, beta, state, slots, gate, nw


def _sample_ref(q, k, v, g, beta, state, slots, gate, nw, store):
    """kda_window_ref on the SAMPLE sequences only: (out rows [len(SAMPLE) * N, H*K], states)."""
    rows = torch.tensor([s * N + i for s in SAMPLE for i in range(N)], device="cuda")
    sl = slots[SAMPLE]
    ref_state = state.clone()
    out = kda_window_ref(q[rows], k[rows], v[rows], g[rows], beta[rows], ref_state, sl,
                         gate[rows], nw, 1e-5, store)
    return rows, out, ref_state[sl]


@pytest.mark.parametrize("state_dtype", [torch.float32, BF])
@pytest.mark.parametrize("store", [True, False])
def test_chunk_real_width(state_dtype, store):
    q, k, v, g, beta, state, slots, gate, nw = _inputs(state_dtype)
    rows, ref_out, ref_states = _sample_ref(q, k, v, g, beta, state, slots, gate, nw, store)
    results = {}
    for name, kw in {"recurrent": {"method": "recurrent"}, "chunk": {"method": "chunk"},
                     "chunk-ieee": {"method": "chunk", "dot_precision": "ieee"},
                     "chunk-bv128": {"method": "chunk", "block_v": 128}}.items():
        st = state.clone()
        out = kda_window(q, k, v, g, beta, st, slots, gate, nw, 1e-5, store, **kw)
        results[name] = (out, st)
        if not store:
            assert torch.equal(st, state), name  # verify leaves the committed state alone
    rec_out, rec_state = results["recurrent"]
    for name, (out, st) in results.items():
        assert out.isfinite().all(), name
        assert _rel(out[rows], ref_out) < 2e-2, name
        assert _rel(out, rec_out) < 2e-2, name
        if not store:
            continue
        if state_dtype == torch.float32:
            assert _rel(st[slots[SAMPLE]], ref_states) < 1e-4, name
            assert _rel(st, rec_state) < 1e-4, name
        else:
            assert torch.allclose(st[slots[SAMPLE]].float(), ref_states.float(), rtol=2**-7,
                                  atol=1e-6), name
            assert torch.allclose(st.float(), rec_state.float(), rtol=2**-7, atol=1e-6), name


def test_default_for_verify_is_the_recurrence():
    """kda_window with no method runs the recurrence for n = 8 (the faster of the two on the
    H200): bitwise the forced call."""
    q, k, v, g, beta, state, slots, gate, nw = _inputs(torch.float32, seed=1)
    a, b = state.clone(), state.clone()
    got = kda_window(q, k, v, g, beta, a, slots, gate, nw, 1e-5, True)
    want = kda_window(q, k, v, g, beta, b, slots, gate, nw, 1e-5, True, method="recurrent")
    assert torch.equal(got, want) and torch.equal(a, b)
