"""The one-pass seeded race (kernels/sampling/race_triton.py) against ``ref.race_ref`` (the
Triton interpreter on CPU): the same token for every row, across the kernel's blocks; and the race's
law: over many seeds, each token wins as often as its softmax probability says."""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.sampling.ref import race_ref

race_triton = pytest.importorskip("glmlab.kernels.sampling.race_triton").race_triton
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the kernel on the GPU, else interpreted


@pytest.mark.parametrize("m, v, seed", [(1, 7, 0), (5, 3000, 1), (3, 4096, 2), (4, 2049, 3)])
def test_kernel_draws_the_reference_token(m, v, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m + 2, v, generator=g) * 3
    x[0, v // 2] = float("-inf")  # a masked token never wins
    idx = torch.randperm(m + 2, generator=g)[:m]
    temp = 0.3 + torch.rand(m, generator=g)
    seeds = torch.randint(0, 2**62, (m,), generator=g)
    pos = torch.randint(0, 10_000, (m,), generator=g)
    want = race_ref(x, idx, temp, seeds, pos)
    got = race_triton(*(t.to(DEV) for t in (x, idx, temp, seeds, pos)))
    assert torch.equal(got.cpu(), want)


def test_the_running_best_crosses_blocks():
    # three finite scores in three different 2,048-token blocks of the kernel, the rest masked:
    # whichever block holds the winner, the kernel's running best agrees with the reference
    v = 4100
    seeds, pos = torch.tensor([5, 6, 7]), torch.tensor([9, 9, 9])
    x = torch.full((3, v), float("-inf"))
    x[:, [10, 3000, 4099]] = torch.tensor([0.0, 0.1, -0.1])
    want = race_ref(x, torch.arange(3), torch.ones(3), seeds, pos)
    got = race_triton(*(t.to(DEV) for t in (x, torch.arange(3), torch.ones(3), seeds, pos)))
    assert torch.equal(got.cpu(), want)
    assert set(want.tolist()) <= {10, 3000, 4099}


def test_the_race_samples_the_softmax():
    # 4 tokens, 4,000 seeds: each token's share within 4 standard errors of its probability
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    n = 4000
    x = logits.expand(n, 4).contiguous()
    args = (x, torch.arange(n), torch.ones(n), torch.arange(n), torch.full((n,), 3))
    tokens = race_triton(*(t.to(DEV) for t in args)).cpu()
    share = torch.bincount(tokens, minlength=4).float() / n
    p = logits.softmax(-1)[0]
    assert torch.all((share - p).abs() <= 4 * (p * (1 - p) / n).sqrt())


_AOT = """
from glmlab.kernels.moe.aot import _jit, compile_sm90
from glmlab.kernels.sampling import race_triton as r
k = r._race_kernel
types = {"x_ptr": "*fp32", "idx_ptr": "*i64", "temp_ptr": "*fp32", "seed_ptr": "*i64",
         "pos_ptr": "*i64", "out_ptr": "*i64", "golden": "i64", "mix1": "i64", "mix2": "i64"}
c = compile_sm90(k, {a: types.get(a, "i32") for a in _jit(k).arg_names}, dict(BV=2048),
                 num_warps=8)
print(c.name)
"""


def test_kernel_compiles_for_sm90():
    """The real compiler for H200 (the interpreter accepts int64 code it may reject), in a
    subprocess without TRITON_INTERPRET."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _AOT], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "_race_kernel"
