"""The one-pass penalties and token-mask kernels against their torch references (bitwise, fp32;
the Triton interpreter on CPU), the sampler drawing the same tokens with either backend, and
both kernels compiling for sm_90."""

from __future__ import annotations

import pytest
import torch

from glmlab.core import Req, SamplingParams
from glmlab.kernels.sampling.ref import apply_penalties_ref, apply_token_mask_ref
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


@pytest.mark.parametrize("m, v, seed", [(1, 33, 0), (4, 3000, 1)])
def test_token_mask_equals_reference_bitwise(m, v, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m + 2, v, generator=g)
    idx = torch.randperm(m + 2, generator=g)[:m]
    words = torch.randint(-(2 ** 31), 2 ** 31, (m, (v + 31) // 32), generator=g,
                          dtype=torch.int64).to(torch.int32)  # bit 31 set in about half
    want, got = x.clone(), x.clone()
    apply_token_mask_ref(want, idx, words)
    triton_impl.apply_token_mask_triton(got, idx, words)
    assert torch.equal(want, got)
    row = int(idx[0])
    allowed = [t for t in range(v) if (int(words[0, t // 32]) >> (t % 32)) & 1]
    assert torch.isfinite(got[row]).nonzero().flatten().tolist() == allowed


class _Only:
    """A grammar that allows the tokens in ``ok`` (the GrammarMatcher protocol)."""

    stop_token_ids = frozenset()

    def __init__(self, ok: set[int]):
        self.ok = ok

    def fill_mask(self, bitmask, row):
        bitmask[row] = 0
        for t in self.ok:
            bitmask[row, t // 32] |= (1 << (t % 32)) if t % 32 < 31 else -(2 ** 31)


def test_sampler_draws_the_same_with_either_backend():
    v = 300
    reqs = [Req(f"r{i}", list(range(i, i + 40)) + [7, 7, 9], 40,
                SamplingParams(temperature=1.0, seed=i, max_new_tokens=8, frequency_penalty=0.7,
                               presence_penalty=0.3, repetition_penalty=1.3,
                               logit_bias=((5, 2.0),), min_new_tokens=5, logprobs=3),
                48, frozenset({1, 2}), seed=i) for i in range(4)]
    reqs[1].grammar, reqs[3].grammar = _Only({31, 63, 200}), _Only({5, 6})
    logits = torch.randn(4, v, generator=torch.Generator().manual_seed(3))
    a = BatchSampler(v, "cpu").sample(reqs, logits)
    race = pytest.importorskip("glmlab.kernels.sampling.race_triton").race_triton
    b = BatchSampler(v, "cpu", triton_impl.apply_penalties_triton,
                     triton_impl.apply_token_mask_triton, race).sample(reqs, logits)
    assert a == b
    assert a[1].tokens[0] in {31, 63, 200} and a[3].tokens[0] in {5, 6}


_AOT = """
from glmlab.kernels.moe.aot import _jit, compile_sm90
from glmlab.kernels.sampling import penalties_triton as p
k = p._penalties_kernel
ptrs = {"x_ptr": "*fp32", "idx_ptr": "*i64", "rows_ptr": "*i64", "counts_ptr": "*fp32",
        "prompt_ptr": "*u8", "bias_ptr": "*fp32", "stops_ptr": "*u8", "rep_ptr": "*fp32",
        "freq_ptr": "*fp32", "pres_ptr": "*fp32", "early_ptr": "*u8"}
c = compile_sm90(k, {a: ptrs.get(a, "i32") for a in _jit(k).arg_names}, dict(BV=1024),
                 num_warps=4)
k = p._token_mask_kernel
ptrs = {"x_ptr": "*fp32", "idx_ptr": "*i64", "mask_ptr": "*i32"}
d = compile_sm90(k, {a: ptrs.get(a, "i32") for a in _jit(k).arg_names}, dict(BV=1024),
                 num_warps=4)
print(c.name, d.name)
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
    assert done.stdout.split()[-2:] == ["_penalties_kernel", "_token_mask_kernel"]
