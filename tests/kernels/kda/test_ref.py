"""The two KDA references agree with each other and with fla's naive functions (outside oracle)."""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.kda.ref import causal_conv_ref, kda_chunk_ref, kda_gate_ref, kda_recurrent_ref
from glmlab.testing.compare import assert_close


@pytest.mark.parametrize(
    "b,t,h,k,v,chunk,strong",
    [
        pytest.param(1, 64, 2, 16, 16, 64, False, id="one-chunk"),
        pytest.param(2, 100, 2, 16, 8, 32, False, id="ragged-tail"),
        pytest.param(1, 5, 3, 8, 8, 64, False, id="shorter-than-chunk"),
        pytest.param(1, 130, 1, 32, 32, 64, True, id="strong-decay"),
    ],
)
def test_chunk_matches_recurrent(make_kda_case, b, t, h, k, v, chunk, strong):
    q, kk, vv, g, beta, s0 = make_kda_case(b, t, h, k, v, strong_decay=strong)
    o_r, s_r = kda_recurrent_ref(q, kk, vv, g, beta, s0)
    o_c, s_c = kda_chunk_ref(q, kk, vv, g, beta, s0, chunk_size=chunk)
    assert_close("kda o", o_r, o_c, "fp32_chunk")
    assert_close("kda state", s_r, s_c, "fp32_chunk")


def test_split_sequences_carry_state(make_kda_case):
    q, kk, vv, g, beta, s0 = make_kda_case(1, 90, 2, 16, 16, seed=3)
    o_full, s_full = kda_chunk_ref(q, kk, vv, g, beta, s0)
    o1, s1 = kda_chunk_ref(q[:, :37], kk[:, :37], vv[:, :37], g[:, :37], beta[:, :37], s0)
    o2, s2 = kda_recurrent_ref(q[:, 37:], kk[:, 37:], vv[:, 37:], g[:, 37:], beta[:, 37:], s1)
    assert_close("kda split o", o_full, torch.cat([o1, o2], dim=1), "fp32_chunk")
    assert_close("kda split state", s_full, s2, "fp32_chunk")


def test_against_fla_naive(make_kda_case):
    naive = pytest.importorskip("fla.ops.kda.naive")
    q, kk, vv, g, beta, s0 = make_kda_case(2, 48, 2, 16, 16, seed=7)
    # fla applies the scale itself: pass unscaled q and scale=K^-0.5
    o_f, s_f = naive.naive_recurrent_kda(
        q * 16**0.5, kk, vv, g, beta, scale=16**-0.5, initial_state=s0, output_final_state=True
    )
    o_c, s_c = kda_chunk_ref(q, kk, vv, g, beta, s0, chunk_size=16)
    assert_close("kda vs fla o", o_f, o_c, "fp32_chunk")
    assert_close("kda vs fla state", s_f, s_c, "fp32_chunk")


def test_gate_against_fla():
    gate_mod = pytest.importorskip("fla.ops.kda.gate")
    g = torch.Generator().manual_seed(1)
    f = torch.randn(3, 4 * 8, generator=g)
    a_log = torch.randn(4, generator=g)
    dt = torch.randn(4 * 8, generator=g)
    ours = kda_gate_ref(f, a_log, dt, -5.0)
    theirs = gate_mod.naive_kda_lowerbound_gate(f.view(3, 4, 8), a_log, dt, lower_bound=-5.0)
    assert_close("kda gate", theirs, ours, "fp32")


def test_causal_conv_state_carry():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(20, 6, generator=g)
    w = torch.randn(6, 4, generator=g)
    y_full, s_full = causal_conv_ref(x, w, None)
    y1, s1 = causal_conv_ref(x[:7], w, None)
    y2, s2 = causal_conv_ref(x[7:8], w, s1)
    y3, s3 = causal_conv_ref(x[8:], w, s2)
    assert torch.equal(s_full, s3) and torch.equal(s_full, x[-3:].t())
    assert_close("conv", y_full, torch.cat([y1, y2, y3]), "fp32")
    # direct definition: y[t, c] = silu(sum_i w[c, i] x[t - 3 + i, c]) with zeros before t = 0
    xp = torch.cat([torch.zeros(3, 6), x])
    direct = torch.stack([(xp[t : t + 4].t() * w).sum(-1) for t in range(20)])
    assert_close("conv direct", torch.nn.functional.silu(direct), y_full, "fp32")
