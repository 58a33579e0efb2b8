"""Fused KDA input prep (kernels/kda/prep_triton.py) against kernels/kda/prep_ref.py, and the
reference itself against the layer's own per-sequence conv (causal_conv_ref) for a verify window.
fp32 under the CPU interpreter."""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.kda.prep_ref import kda_prep_ref
from glmlab.kernels.kda.prep_triton import kda_prep
from glmlab.kernels.kda.ref import causal_conv_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"
H, K = 2, 16
P = H * K


def _inputs(n_seq, n, seed):
    g = torch.Generator().manual_seed(seed)
    t = n_seq * n
    wide = torch.randn(t, 3 * P + 5, generator=g)
    qkv = wide[:, 5:]  # strided rows, as a column slice of a fused projection
    conv = torch.randn(n_seq + 2, 3 * P, 3, generator=g)
    slots = torch.randperm(n_seq + 2, generator=g)[:n_seq]
    cw = torch.randn(3 * P, 4, generator=g) * 0.5
    f = torch.randn(t, P, generator=g)
    a_log = torch.randn(H, generator=g) * 0.3
    dtb = torch.randn(P, generator=g) - 3
    b = torch.randn(t, H, generator=g)
    return [x.to(DEV) for x in (qkv, conv, slots, cw, f, a_log, dtb, b)]


@pytest.mark.parametrize("n_seq,n", [(3, 1), (2, 5)])
def test_prep_matches_reference_and_updates_conv_state(n_seq, n):
    qkv, conv, slots, cw, f, a_log, dtb, b = _inputs(n_seq, n, seed=n)
    conv_ref = conv.clone()
    want = kda_prep_ref(qkv, conv_ref, slots, cw, f, a_log, dtb, -5.0, b, H)
    got = kda_prep(qkv, conv, slots, cw, f, a_log, dtb, -5.0, b, H)
    for a, r in zip(got, want, strict=True):
        assert a.dtype == r.dtype and a.shape == r.shape
        assert torch.allclose(a, r, rtol=1e-5, atol=1e-6)
    assert torch.allclose(conv, conv_ref)  # new state at the slots, other slots untouched


def test_reference_conv_equals_the_layers_per_sequence_conv():
    qkv, conv, slots, cw, f, a_log, dtb, b = _inputs(2, 4, seed=3)
    held = conv[slots].clone()
    q, k, v, *_ = kda_prep_ref(qkv, conv.clone(), slots, cw, f, a_log, dtb, -5.0, b, H)
    for i in range(2):
        y, state = causal_conv_ref(qkv[i * 4:(i + 1) * 4], cw, held[i])
        assert torch.allclose(v[i * 4:(i + 1) * 4].flatten(1), y[:, 2 * P:], atol=1e-6)
        assert state.shape == (3 * P, 3)


def test_other_conv_widths_are_refused():
    qkv, conv, slots, cw, f, a_log, dtb, b = _inputs(1, 1, seed=0)
    with pytest.raises(ValueError, match="conv width"):
        kda_prep(qkv, conv[:, :, :2], slots, cw[:, :3], f, a_log, dtb, -5.0, b, H)
