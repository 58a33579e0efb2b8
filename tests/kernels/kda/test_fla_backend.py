"""fla's KDA kernels as glmlab backends, against the torch references (varlen, carried states)."""

from __future__ import annotations

import pytest
import torch

from glmlab.model.backends import KDA_DECODE, KDA_PREFILL
from glmlab.testing.compare import assert_close


def _varlen(make, lengths, h, k, v, seed, device, dtype):
    """Tokens of all sequences concatenated ([T, H, *]), one initial state per sequence."""
    q, kk, vv, g, beta, _ = (t[0] for t in make(1, sum(lengths), h, k, v, seed=seed))
    gen = torch.Generator().manual_seed(seed)
    states = torch.randn(len(lengths), h, k, v, generator=gen) * 0.5
    cu = torch.tensor([0, *lengths]).cumsum(0)
    cast = [t.to(device, dtype) for t in (q, kk, vv)]
    return (*cast, g.to(device), beta.to(device, dtype), states.to(device), cu.to(device))


@pytest.mark.parametrize(
    "lengths", [pytest.param((40,), id="one"), pytest.param((7, 33), id="two")]
)
def test_fla_prefill_matches_reference_cpu(fla_on_cpu, make_kda_case, lengths):
    if torch.cuda.is_available():
        pytest.skip("the GPU run is test_fla_on_gpu")
    args = _varlen(make_kda_case, lengths, 2, 16, 16, 3, "cpu", torch.float32)
    o_ref, s_ref = KDA_PREFILL.get("torch")(*args)
    o, s = KDA_PREFILL.get("fla")(*args)
    assert_close("fla chunk o", o_ref, o.float(), "fp32_chunk")
    assert_close("fla chunk state", s_ref, s.float(), "fp32_chunk")


def test_fla_decode_matches_reference_cpu(fla_on_cpu, make_kda_case):
    if torch.cuda.is_available():
        pytest.skip("the GPU run is test_fla_on_gpu")
    q, k, v, g, beta, s, _ = _varlen(make_kda_case, (1, 1, 1), 2, 16, 16, 4, "cpu", torch.float32)
    o_ref, s_ref = KDA_DECODE.get("torch")(q, k, v, g, beta, s)
    o, s2 = KDA_DECODE.get("fla")(q, k, v, g, beta, s)
    assert_close("fla recurrent o", o_ref, o.float(), "fp32_chunk")
    assert_close("fla recurrent state", s_ref, s2.float(), "fp32_chunk")


@pytest.mark.gpu
def test_fla_on_gpu(make_kda_case):
    args = _varlen(make_kda_case, (300, 64, 1000), 8, 128, 128, 5, "cuda", torch.bfloat16)
    ref_args = tuple(a.float() if a.is_floating_point() else a for a in args)
    o_ref, s_ref = KDA_PREFILL.get("torch")(*ref_args)
    o, s = KDA_PREFILL.get("fla")(*args)
    assert_close("fla chunk o bf16", o_ref, o.float(), "bf16")
    assert_close("fla chunk state bf16", s_ref, s.float(), "bf16")
    q, k, v, g, beta, st, _ = _varlen(
        make_kda_case, (1,) * 16, 8, 128, 128, 6, "cuda", torch.bfloat16
    )
    o_ref, s_ref = KDA_DECODE.get("torch")(q.float(), k.float(), v.float(), g, beta.float(), st)
    o, s2 = KDA_DECODE.get("fla")(q, k, v, g, beta, st)
    assert_close("fla recurrent o bf16", o_ref, o.float(), "bf16")
    assert_close("fla recurrent state bf16", s_ref, s2.float(), "bf16")
