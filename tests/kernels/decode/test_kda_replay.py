"""ReplaySSM commit kernel (kernels/decode/kda_replay_triton.py) against kernels/decode/ref.py
(``kda_replay_ref``: kda.ref.kda_recurrent_ref over each accepted prefix), under the CPU
interpreter (tests/conftest.py sets TRITON_INTERPRET before any kernel module is imported)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from glmlab.kernels.decode.kda_replay_triton import kda_replay_commit, replay_value_block
from glmlab.kernels.decode.ref import kda_replay_ref
from glmlab.kernels.kda.ref import l2norm

DEV = "cuda" if torch.cuda.is_available() else "cpu"
H = 2


def _ring(num_rows, width, dk, seed, act_dtype=torch.float32):
    """One layer's ring as ReplayRing keeps it: k, g [R, D, H, K] fp32, v [R, D, H, V] and
    beta [R, D, H] in the activation dtype."""
    g = torch.Generator().manual_seed(seed)
    k = l2norm(torch.randn(num_rows, width, H, dk, generator=g))
    v = torch.randn(num_rows, width, H, dk, generator=g).to(act_dtype)
    gg = -5 * torch.rand(num_rows, width, H, dk, generator=g)  # the gate's range (lower bound -5)
    beta = torch.rand(num_rows, width, H, generator=g).to(act_dtype)
    return [x.to(DEV) for x in (k, v, gg, beta)]


def _states(num_slots, dk, seed, dtype):
    g = torch.Generator().manual_seed(seed + 100)
    return (torch.randn(num_slots, H, dk, dk, generator=g) * 0.1).to(dtype).to(DEV)


def _ids(*xs):
    return [torch.tensor(x, device=DEV) for x in xs]


# Rows are a permutation unrelated to the slots; slot 1 is in no request and must stay bitwise.
# Lengths mix 0 (abandoned: untouched), 1, a partial prefix and the full window D.
@pytest.mark.parametrize("dk,width,block_v", [(16, 4, None), (16, 8, 8), (32, 5, 16)])
def test_replay_matches_reference_fp32(dk, width, block_v):
    k, v, g, beta = _ring(4, width, dk, seed=width)
    state = _states(6, dk, seed=width, dtype=torch.float32)
    slots, rows, lens = _ids([4, 0, 2, 5], [2, 3, 0, 1], [0, 1, width // 2, width])
    want, got = state.clone(), state.clone()
    kda_replay_ref(want, slots, rows, k, v, g, beta, lens)
    kda_replay_commit(got, slots, rows, k, v, g, beta, lens, block_v=block_v)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    for untouched in (1, 3, 4):  # not in slots, not in slots, commit length 0
        assert torch.equal(got[untouched], state[untouched])
    assert not torch.allclose(got[5], state[5])  # the full window really ran


# bf16 state and activations: both sides read the same bf16 values into fp32 and round their
# fp32 results (which differ by ~1e-6 in summation order) once, to bf16, where a value near a
# rounding boundary may land one bf16 ulp apart: 2^-7 of the value (8 significant bits). The
# interpreter also truncates fp32 -> bf16 where torch rounds to nearest (test_kda_window.py).
@pytest.mark.parametrize("block_v", [None, 8])
def test_replay_matches_reference_bf16(block_v):
    k, v, g, beta = _ring(5, 6, 16, seed=7, act_dtype=torch.bfloat16)
    state = _states(7, 16, seed=7, dtype=torch.bfloat16)
    slots, rows, lens = _ids([6, 1, 3], [4, 0, 2], [6, 3, 1])
    want, got = state.clone(), state.clone()
    kda_replay_ref(want, slots, rows, k, v, g, beta, lens)
    kda_replay_commit(got, slots, rows, k, v, g, beta, lens, block_v=block_v)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), want.float(), rtol=2**-7, atol=1e-6)
    untouched = [s for s in range(7) if s not in (6, 1, 3)]
    assert torch.equal(got[untouched], state[untouched])


def test_lengths_are_clamped_and_unbound_rows_skipped():
    """No host-side validation on the fast path, so out-of-range values must stay memory safe:
    a length past D replays D steps, a negative one nothing, a row of -1 nothing."""
    k, v, g, beta = _ring(3, 4, 16, seed=3)
    state = _states(4, 16, seed=3, dtype=torch.float32)
    slots, rows, lens = _ids([0, 1, 2, 3], [0, 1, -1, 2], [9, -2, 4, 4])
    got = state.clone()
    kda_replay_commit(got, slots, rows, k, v, g, beta, lens)
    want = state.clone()
    ref_slots, ref_rows, ref_lens = _ids([0, 3], [0, 2], [4, 4])
    kda_replay_ref(want, ref_slots, ref_rows, k, v, g, beta, ref_lens)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[1:3], state[1:3])


def test_int32_ids_and_no_requests():
    k, v, g, beta = _ring(2, 4, 16, seed=5)
    state = _states(3, 16, seed=5, dtype=torch.float32)
    slots, rows, lens = (t.int() for t in _ids([2, 0], [1, 0], [3, 4]))
    want, got = state.clone(), state.clone()
    kda_replay_ref(want, slots, rows, k, v, g, beta, lens)
    kda_replay_commit(got, slots, rows, k, v, g, beta, lens)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    empty = torch.zeros(0, dtype=torch.long, device=DEV)
    kda_replay_commit(got, empty, empty, k, v, g, beta, empty)  # a commit of no request: no-op


def test_bad_inputs_are_refused():
    k, v, g, beta = _ring(2, 4, 16, seed=1)
    state = _states(3, 16, seed=1, dtype=torch.float32)
    slots, rows, lens = _ids([0, 1], [0, 1], [1, 2])
    cases = [
        ((state, slots, rows, k, v[..., :8], g, beta, lens), "v must be"),
        ((state, slots, rows, k, v, g, beta[:, :3], lens), "beta must be"),
        ((state[:, :1], slots, rows, k, v, g, beta, lens), "recurrent must be"),
        ((state, slots, rows[:1], k, v, g, beta, lens), "rows must be"),
        ((state, slots, rows, k, v, g, beta, lens.float()), "integer"),
        ((state, slots, rows, k.bfloat16(), v, g, beta, lens), "fp32"),
        ((state, slots, rows, k, v, g, beta.half(), lens), "activation dtype"),
        ((state.half(), slots, rows, k, v, g, beta, lens), "fp32 or bf16"),
        ((state, slots, rows, k.transpose(0, 1).contiguous().transpose(0, 1), v, g, beta, lens),
         "contiguous"),
        ((state.transpose(2, 3), slots, rows, k, v, g, beta, lens), "contiguous"),
    ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            kda_replay_commit(*args)
    with pytest.raises(ValueError, match="value block"):
        kda_replay_commit(state, slots, rows, k, v, g, beta, lens, block_v=12)


def test_value_block():
    assert replay_value_block(128) == 32  # four programs per 128 x 128 head (H200 best)
    assert replay_value_block(16) == 16


@pytest.mark.gpu
def test_replay_real_width_on_gpu():
    """The H200 reference point's shape: 132 requests, 16 heads of 128 x 128, D = 8, bf16 state
    and activations; every commit length 0..8 present."""
    k, v, g, beta = _ring(140, 8, 128, seed=11, act_dtype=torch.bfloat16)
    k, v, g, beta = (x.repeat(1, 1, 8, *([1] * (x.dim() - 3))).contiguous()
                     for x in (k, v, g, beta))  # H = 2 -> 16 heads
    state = (torch.randn(150, 16, 128, 128, device=DEV) * 0.1).bfloat16()
    slots = torch.randperm(150, device=DEV)[:132]
    rows = torch.randperm(140, device=DEV)[:132]
    lens = torch.arange(132, device=DEV) % 9
    want, got = state.clone(), state.clone()
    kda_replay_ref(want, slots, rows, k, v, g, beta, lens)
    kda_replay_commit(got, slots, rows, k, v, g, beta, lens)
    assert torch.allclose(got.float(), want.float(), rtol=2**-7, atol=1e-5)


_AOT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from glmlab.kernels.decode.kda_replay_triton import _replay_commit_kernel
from glmlab.kernels.decode.kda_window_triton import window_warps
for state in ("*fp32", "*bf16"):
    sig = {"state_ptr": state, "slots_ptr": "*i64", "rows_ptr": "*i64", "lens_ptr": "*i64",
           "k_ptr": "*fp32", "v_ptr": "*bf16", "g_ptr": "*fp32", "beta_ptr": "*bf16",
           "H": "i32", "D": "i32", "stride_ss": "i32",
           "K": "constexpr", "V": "constexpr", "BV": "constexpr"}
    src = ASTSource(_replay_commit_kernel, sig, constexprs={"K": 128, "V": 128, "BV": 32})
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": window_warps(128, 32)})
    print(len(c.asm["cubin"]) > 0, "local" if ".local" in c.asm["ptx"] else "no-local")
"""


def test_compiles_for_sm90_without_spills():
    """Real Triton compiler for Hopper at the served width (128 x 128 heads, BV 32, the launch's
    warps), in a process without the interpreter switch: the [128, 32] fp32 slice stays in
    registers."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _AOT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split("\n")[:2] == ["True no-local", "True no-local"], res.stdout
