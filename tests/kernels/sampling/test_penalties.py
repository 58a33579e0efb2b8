"""The one-pass penalties kernel against its torch reference (bitwise, fp32; the Triton
interpreter on CPU), and the sampler with either backend drawing the same tokens."""

from __future__ import annotations

import pytest
import torch

from glmlab.core import Req, SamplingParams
from glmlab.kernels.sampling.ref import apply_penalties_ref
from glmlab.sampling import BatchSampler

triton_impl = pytest.importorskip("glmlab.kernels.sampling.penalties_triton")


def _case(m: int, s: int, v: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m + 3, v, generator=g) * 4
    idx = torch.randperm(m + 3, generator=g)[:m]
    rows = torch.randperm(s, generator=g)[:m]
    counts = torch.randint(0, 3, (s, v), generator=g).float() * (torch.rand(s, v, generator=g)
                                                                  < 0.2)
    prompt = torch.rand(s, v, generator=g) < 0.3
    bias = torch.randn(s, v, generator=g) * (torch.rand(s, v, generator=g) < 0.1)
    stops = torch.rand(s, v, generator=g) < 0.05
    rep = 1 + torch.rand(m, generator=g)
    freq, pres = torch.rand(m, generator=g), torch.rand(m, generator=g) - 0.5
    early = torch.rand(m, generator=g) < 0.5
    return x, idx, rows, counts, prompt, bias, stops, rep, freq, pres, early


@pytest.mark.parametrize("m, s, v, seed", [(1, 1, 7, 0), (5, 8, 1500, 1), (3, 4, 2048, 2)])
def test_kernel_equals_reference_bitwise(m, s, v, seed):
    args = _case(m, s, v, seed)
    want, got = args[0].clone(), args[0].clone()
    apply_penalties_ref(want, *args[1:])
    triton_impl.apply_penalties_triton(got, *args[1:])
    assert torch.equal(torch.isinf(want), torch.isinf(got))
    assert torch.equal(want, got)
    untouched = [i for i in range(want.shape[0]) if i not in set(args[1].tolist())]
    assert torch.equal(got[untouched], args[0][untouched])  # other rows are left alone


def test_sampler_draws_the_same_with_either_backend():
    v = 300
    reqs = [Req(f"r{i}", list(range(i, i + 40)) + [7, 7, 9], 40,
                SamplingParams(temperature=1.0, seed=i, max_new_tokens=8, frequency_penalty=0.7,
                               presence_penalty=0.3, repetition_penalty=1.3,
                               logit_bias=((5, 2.0),), min_new_tokens=5, logprobs=3),
                48, frozenset({1, 2}), seed=i) for i in range(4)]
    logits = torch.randn(4, v, generator=torch.Generator().manual_seed(3))
    a = BatchSampler(v, "cpu").sample(reqs, logits)
    b = BatchSampler(v, "cpu", triton_impl.apply_penalties_triton).sample(reqs, logits)
    assert a == b


_AOT = """
from glmlab.kernels.moe.aot import _jit, compile_sm90
from glmlab.kernels.sampling import penalties_triton as p
k = p._penalties_kernel
ptrs = {"x_ptr": "*fp32", "idx_ptr": "*i64", "rows_ptr": "*i64", "counts_ptr": "*fp32",
        "prompt_ptr": "*u8", "bias_ptr": "*fp32", "stops_ptr": "*u8", "rep_ptr": "*fp32",
        "freq_ptr": "*fp32", "pres_ptr": "*fp32", "early_ptr": "*u8"}
c = compile_sm90(k, {a: ptrs.get(a, "i32") for a in _jit(k).arg_names}, dict(BV=1024),
                 num_warps=4)
print(c.name, c.shared)
"""


def test_kernel_compiles_for_sm90():
    """The real compiler for H200 (the interpreter accepts what it may reject), in a subprocess
    without TRITON_INTERPRET."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _AOT], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[0] == "_penalties_kernel"
