"""The one-pass logprobs table (kernels/sampling/logprobs_triton.py) against
``ref.logprob_table_ref`` (the Triton interpreter on CPU): the same log-softmax values to 1e-5
and the same top ids, across chunk boundaries, partial last chunks, masked (-inf) rows and
``top`` from 0 to 20; and the inputs it refuses."""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.sampling.ref import logprob_table_ref

lp = pytest.importorskip("glmlab.kernels.sampling.logprobs_triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the kernel on the GPU, else interpreted


def _distinct_logits(n: int, v: int, seed: int) -> torch.Tensor:
    """Random logits with distinct values (so the top ids are defined), scale ~3."""
    g = torch.Generator().manual_seed(seed)
    ranks = torch.stack([torch.randperm(v, generator=g) for _ in range(n)]).float()
    return (ranks / v - 0.5) * 6 + torch.rand(n, v, generator=g) * (0.5 / v)


def _check(x: torch.Tensor, tokens: torch.Tensor, top: int, chunk: int,
           exact_ids: bool = True) -> torch.Tensor:
    want = logprob_table_ref(x, tokens, top)
    got = lp.logprob_table_triton(x.to(DEV), tokens.to(DEV), top, chunk).cpu()
    assert got.shape == want.shape == (x.shape[0], 1 + 2 * top) and got.dtype == want.dtype
    torch.testing.assert_close(got[:, :1 + top], want[:, :1 + top], atol=1e-5, rtol=1e-5)
    if exact_ids:
        assert torch.equal(got[:, 1 + top:], want[:, 1 + top:])
    return got


@pytest.mark.parametrize("n, v, top, chunk", [
    (1, 7, 1, 16),  # one partial chunk, the whole row in it
    (3, 300, 5, 4096),  # V far below one chunk (the default chunk)
    (4, 5000, 20, 1024),  # V not a multiple of the chunk: a partial last chunk
    (2, 4096, 20, 1024),  # V a multiple of the chunk
    (6, 20_000, 20, 2048),  # 10 chunks, the last one partial
    (5, 3000, 0, 512),  # no alternatives: [N, 1]
    (2, 40, 40, 16),  # top = V: every column, across 3 chunks
])
def test_kernel_matches_the_reference(n, v, top, chunk):
    x = _distinct_logits(n, v, seed=v + top)
    tokens = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(top))
    _check(x, tokens, top, chunk)


def test_a_huge_winner_in_the_last_partial_chunk():
    # a row's winner (and runner-up) in the last, partial chunk: its sum dominates the
    # logsumexp, so the other chunks' sums only count rescaled by exp(chunk max - row max)
    n, v = 3, 5000
    x = _distinct_logits(n, v, seed=1)
    x[0, v - 1] = 80.0
    x[1, v - 2], x[1, v - 1] = 60.0, 59.0
    x[2, 4096] = 40.0  # the first column of the last chunk
    tokens = torch.tensor([v - 1, 0, 4096])
    got = _check(x, tokens, 5, 1024)
    assert got[0, 0].abs() < 1e-6 and got[0, 1 + 5] == v - 1


def test_masked_rows():
    # row 0: three finite entries in different chunks, the rest -inf (a grammar's mask); row 1:
    # a few -inf among finite ones. The finite picks match; past them both give -inf values
    # (torch orders -inf ties as it likes: only the finite ids are compared)
    v, top = 3000, 5
    x = _distinct_logits(2, v, seed=2)
    x[0] = float("-inf")
    x[0, [10, 1500, 2999]] = torch.tensor([0.5, 2.0, -1.0])
    x[1, [0, 7, 2048]] = float("-inf")
    tokens = torch.tensor([1500, 7])  # row 1's token is masked: its logprob is -inf
    got = _check(x, tokens, top, 1024, exact_ids=False)
    want = logprob_table_ref(x, tokens, top)
    finite = torch.isfinite(want[:, 1:1 + top])
    assert torch.equal(got[:, 1 + top:][finite], want[:, 1 + top:][finite])
    assert finite[0].sum() == 3 and got[0, 1 + top:1 + top + 3].tolist() == [1500, 10, 2999]
    assert got[1, 0] == float("-inf")
    # the -inf entries that fill row 0 are distinct columns, lowest first
    assert got[0, 1 + top + 3:].tolist() == [0, 1]


def test_ties_go_to_the_lower_column():
    x = torch.zeros(1, 100)
    x[0, [70, 3, 50]] = 1.0  # equal winners in different chunks
    got = lp.logprob_table_triton(x.to(DEV), torch.tensor([3], device=DEV), 4, 16).cpu()
    assert got[0, 5:].tolist() == [3, 50, 70, 0]


def test_empty_batch():
    got = lp.logprob_table_triton(torch.zeros(0, 10, device=DEV),
                                  torch.zeros(0, dtype=torch.long, device=DEV), 3)
    assert got.shape == (0, 7)


@pytest.mark.parametrize("logits, tokens, top, match", [
    (torch.zeros(2, 10, dtype=torch.float16), torch.zeros(2, dtype=torch.long), 1, "fp32"),
    (torch.zeros(10), torch.zeros(1, dtype=torch.long), 1, "2-D"),
    (torch.zeros(2, 10), torch.zeros(3, dtype=torch.long), 1, "tokens"),
    (torch.zeros(2, 10), torch.zeros(2, dtype=torch.int32), 1, "int64"),
    (torch.zeros(2, 10), torch.zeros(2, dtype=torch.long), 11, "top"),
    (torch.zeros(2, 100), torch.zeros(2, dtype=torch.long), 65, "top"),
    (torch.zeros(2, 10), torch.zeros(2, dtype=torch.long), -1, "top"),
])
def test_bad_inputs_are_refused(logits, tokens, top, match):
    with pytest.raises(ValueError, match=match):
        lp.logprob_table_triton(logits, tokens, top)


def test_bad_chunk_is_refused():
    with pytest.raises(ValueError, match="chunk"):
        lp.logprob_table_triton(torch.zeros(1, 10), torch.zeros(1, dtype=torch.long), 1, 1000)


_AOT = """
from glmlab.kernels.moe.aot import _jit, compile_sm90
from glmlab.kernels.sampling import logprobs_triton as lp
names = []
for top, pad in ((20, 32), (0, 1)):
    k = lp._chunk_kernel
    types = {"x_ptr": "*fp32", "max_ptr": "*fp32", "sum_ptr": "*fp32", "key_ptr": "*i64"}
    c = compile_sm90(k, {a: types.get(a, "i32") for a in _jit(k).arg_names},
                     dict(HAS_TOP=top > 0, TOP_PAD=pad, CHUNK=4096), num_warps=8)
    k = lp._merge_kernel
    types |= {"tok_ptr": "*i64", "out_ptr": "*fp32" if top else "*fp64"}
    d = compile_sm90(k, {a: types.get(a, "i32") for a in _jit(k).arg_names},
                     dict(HAS_TOP=top > 0, TOP_PAD=pad, CHUNKS_PAD=64,
                          CANDIDATES_PAD=64 * pad),
                     num_warps=4)
    names += [c.name, d.name]
print(*names)
"""


def test_kernels_compile_for_sm90():
    """The real compiler for H200 (the interpreter accepts int64 and bitcast code it may
    reject), in a subprocess without TRITON_INTERPRET: the real-vocabulary launch (38 chunks,
    top 20, fp32 table) and top 0 with an fp64 table."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _AOT], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-4:] == ["_chunk_kernel", "_merge_kernel"] * 2
