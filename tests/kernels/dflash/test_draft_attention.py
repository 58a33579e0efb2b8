"""DFlash2 draft attention over slot-addressed context (kernels/dflash/attention_triton.py)
against kernels/dflash/ref.py, under the CPU interpreter: fp32 inputs at the fp32 bar, bf16
inputs within one bf16 ulp of the output, E4M3 draft KV against the same dequantised reference."""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.dflash.attention_triton import context_splits, draft_attention
from glmlab.kernels.dflash.ref import draft_attention_ref
from glmlab.kernels.fp8.ref import quant_act_fp8

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(lens, b=4, h=4, hkv=2, dh=16, lmax=None, seed=0, dtype=torch.float32, fp8=False,
            pad="minus_one"):
    """Context slots scattered over a permuted store with unused slots between requests;
    padding either -1 (what the drafter writes) or real slots of other rows (must be ignored)."""
    g = torch.Generator().manual_seed(seed)
    n, lmax = len(lens), lmax or max(lens)
    s = sum(lens) + 13
    q = torch.randn(n, b, h, dh, generator=g).to(dtype)
    k_blk = torch.randn(n, b, hkv, dh, generator=g).to(dtype)
    v_blk = torch.randn(n, b, hkv, dh, generator=g).to(dtype)
    kv_k, kv_v = torch.randn(s, hkv, dh, generator=g), torch.randn(s, hkv, dh, generator=g) * 2
    scales = [None, None]
    if fp8:
        pairs = [quant_act_fp8(x.reshape(s * hkv, dh), group=dh) for x in (kv_k, kv_v)]
        (kv_k, ks), (kv_v, vs) = [(x.view(s, hkv, dh), sc.view(s, hkv)) for x, sc in pairs]
        scales = [ks, vs]
    else:
        kv_k, kv_v = kv_k.bfloat16(), kv_v.bfloat16()
    perm = torch.randperm(s, generator=g)
    if pad == "minus_one":
        slots = torch.full((n, lmax), -1, dtype=torch.int32)
    else:
        slots = perm[torch.randint(0, s, (n, lmax), generator=g)].int()
    at = 0
    for i, length in enumerate(lens):
        slots[i, :length] = perm[at:at + length]
        at += length + 2  # two slots of nobody's between requests
    lens_t = torch.tensor(lens, dtype=torch.int32)
    args = [q, k_blk, v_blk, kv_k, kv_v, slots, lens_t]
    return [x.to(DEV) for x in args], [x if x is None else x.to(DEV) for x in scales]


CASES = {  # name: (lens, b, h, hkv, dh, lmax)
    "gqa2": ([1, 37, 20], 4, 4, 2, 16, 40),  # G = 2: an 8-row tile padded to 16 rows
    "gqa4_dh32": ([50, 1, 16], 4, 4, 1, 32, 64),  # G = 4: a 16-row tile
    "wide_block": ([33, 5, 64], 8, 4, 1, 16, 70),  # M = 32 rows, Lmax past every length
    "empty_ctx": ([0, 17, 3], 4, 4, 2, 16, 17),  # a request with only its block to attend to
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("splits", [1, 2, 3, 5])
def test_matches_reference_fp32(case, splits):
    lens, b, h, hkv, dh, lmax = CASES[case]
    args, _ = _inputs(lens, b, h, hkv, dh, lmax, seed=splits)
    scale = dh ** -0.5
    want = draft_attention_ref(*args, scale)
    got = draft_attention(*args, scale, num_splits=splits, block_n=16)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_padding_slots_are_never_read():
    """Padding holding other requests' real slots changes nothing (lengths alone decide)."""
    args, _ = _inputs([9, 30, 2], lmax=32, seed=4, pad="other_slots")
    want = draft_attention_ref(*args, 0.25)
    minus_one, _ = _inputs([9, 30, 2], lmax=32, seed=4)
    assert torch.allclose(want, draft_attention_ref(*minus_one, 0.25))
    got = draft_attention(*args, 0.25, num_splits=3, block_n=16)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_default_split_rule_and_int64_slots():
    args, _ = _inputs([1, 37, 20], lmax=40, seed=7)
    args[5] = args[5].long()
    want = draft_attention_ref(*args, 0.3)
    assert torch.allclose(draft_attention(*args, 0.3), want, rtol=1e-5, atol=1e-5)


# bf16 activations: both sides compute in fp32 and round the output to bf16 once; summation
# order may put a value one bf16 ulp (2^-8 relative at most) apart.
@pytest.mark.parametrize("splits", [1, 3])
def test_matches_reference_bf16(splits):
    args, _ = _inputs([1, 37, 20], lmax=40, seed=11, dtype=torch.bfloat16)
    want = draft_attention_ref(*args, 0.25)
    got = draft_attention(*args, 0.25, num_splits=splits, block_n=16)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), want.float(), rtol=2**-7, atol=2**-8)


# E4M3 draft KV: the kernel multiplies the per-(slot, head) scales into scores and probabilities
# in fp32; the reference dequantises into q's dtype first (fp32 here: the same numbers).
@pytest.mark.parametrize("splits", [1, 2])
def test_fp8_draft_kv(splits):
    lens, b, h, hkv, dh, lmax = CASES["gqa4_dh32"]
    args, scales = _inputs(lens, b, h, hkv, dh, lmax, seed=splits, fp8=True)
    want = draft_attention_ref(*args, dh ** -0.5, *scales)
    got = draft_attention(*args, dh ** -0.5, *scales, num_splits=splits, block_n=16)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_split_rule():
    # the reference point: 132 requests x 2 KV heads at 64K fill 132 SMs 8 times with 4 splits
    assert context_splits(132, 2, 65536, 64, 132) == 4
    assert context_splits(1, 2, 65536, 64, 132) == 256  # one request: every SM, 256-row splits
    assert context_splits(4, 1, 100, 64, 132) == 1  # short contexts are not split
    assert context_splits(132, 2, 0, 64, 132) == 1


def test_bad_shapes_are_refused():
    args, scales = _inputs([3, 4], lmax=4)
    with pytest.raises(ValueError, match="power of two"):
        draft_attention(args[0][..., :8], args[1][..., :8], args[2][..., :8],
                        args[3][..., :8], args[4][..., :8], *args[5:], 1.0)
    with pytest.raises(ValueError, match="scales"):
        draft_attention(*args, 1.0, torch.ones(args[3].shape[:2]), None)
    with pytest.raises(ValueError, match="ctx_slots"):
        draft_attention(*args[:5], args[5][:1], args[6], 1.0)
