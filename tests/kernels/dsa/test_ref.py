"""DSA references: the kernels' two-stage split form equals the one-shot sparse MLA, FP8 pooled-key
scores equal the fp32 ones on dequantised keys, and selection handles the adversarial rows."""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.dsa.ref import (
    EMPTY_LSE,
    candidate_mask,
    indexer_scores_fp8_ref,
    indexer_scores_ref,
    quantize_pool_keys_ref,
    select_ref,
    sparse_mla_combine_ref,
    sparse_mla_partial_ref,
    sparse_mla_ref,
    split_bounds,
)
from glmlab.testing.compare import assert_close


def sparse_inputs(t, h, r, w, n, seed=0, invalid=0.2, empty_rows=()):
    """Queries, a latent cache of n rows, and [t, w] indices with -1 holes and empty rows."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, h, r, generator=g)
    cache = torch.randn(n, r, generator=g)
    idx = torch.randint(0, n, (t, w), generator=g)
    idx[torch.rand(t, w, generator=g) < invalid] = -1
    for row in empty_rows:
        idx[row] = -1
    return q, cache, idx


@pytest.mark.parametrize("width,block,splits", [
    (2112, 32, 1), (2112, 128, 1), (2051, 128, 3), (5, 32, 4), (1, 128, 16), (257, 64, 2),
])
def test_split_bounds_cover_the_list_in_whole_tiles(width, block, splits):
    bounds = split_bounds(width, block, splits)
    assert len(bounds) == splits and bounds[0][0] == 0 and bounds[-1][1] == width
    for (s0, e0), (s1, _) in zip(bounds, bounds[1:], strict=False):
        assert e0 == s1 and s0 <= e0
    assert all(s % block == 0 for s, e in bounds if e > s)


@pytest.mark.parametrize("t,h,r,w,block,splits,empty_rows", [
    pytest.param(4, 2, 32, 37, 32, 1, (), id="irregular-width-one-split"),
    pytest.param(4, 16, 64, 130, 128, 2, (1,), id="block128-virtual-pad-empty-row"),
    pytest.param(3, 4, 32, 5, 32, 4, (0, 2), id="width-below-block-empty-splits"),
    pytest.param(2, 3, 16, 1, 32, 1, (), id="width-one"),
    pytest.param(2, 16, 512, 2112, 32, 3, (1,), id="seed-width-three-splits"),
])
def test_partial_and_combine_equal_one_shot(t, h, r, w, block, splits, empty_rows):
    q, cache, idx = sparse_inputs(t, h, r, w, n=300, empty_rows=empty_rows)
    rows, valid = cache[idx.clamp(min=0)], idx >= 0
    po, pl = sparse_mla_partial_ref(q, rows, valid, 0.125, block, splits)
    assert po.shape == (t, splits, h, r) and pl.shape == (t, splits, h)
    out, lse = sparse_mla_combine_ref(po, pl)
    assert_close("split vs one-shot", sparse_mla_ref(q, rows, valid, 0.125), out, "fp32_chunk")
    for row in empty_rows:
        assert (out[row] == 0).all() and (pl[row] == EMPTY_LSE).all()
    full = ~torch.isin(torch.arange(t), torch.tensor(empty_rows, dtype=torch.long))
    logits = torch.einsum("thr,twr->thw", q, rows) * 0.125
    ref_lse = logits.masked_fill(~valid[:, None], float("-inf")).logsumexp(-1) / torch.log(
        torch.tensor(2.0))
    assert_close("lse (base 2)", ref_lse[full], lse[full], "fp32_chunk")


def test_repeated_and_shuffled_indices():
    """A slot listed twice counts twice; order inside the list does not matter."""
    q, cache, _ = sparse_inputs(2, 2, 16, 4, n=10)
    q[1] = q[0]
    idx = torch.tensor([[3, 3, 7, -1], [7, -1, 3, 3]])
    rows, valid = cache[idx.clamp(min=0)], idx >= 0
    out = sparse_mla_ref(q, rows, valid, 0.3)
    p = torch.softmax(torch.einsum("hr,wr->hw", q[0], cache[[3, 3, 7]]) * 0.3, -1)
    assert_close("row 0", p @ cache[[3, 3, 7]], out[0], "fp32")
    po, pl = sparse_mla_partial_ref(q, rows, valid, 0.3, 32, 1)
    assert_close("shuffled", out[0], sparse_mla_combine_ref(po, pl)[0][1], "fp32")


def test_fp8_pool_keys_and_scores():
    g = torch.Generator().manual_seed(3)
    keys = torch.randn(40, 16, generator=g)
    keys[5] = 0.0
    kf, ks = quantize_pool_keys_ref(keys)
    assert kf.dtype == torch.float8_e4m3fn and ks[5] == 0 and (kf[5].float() == 0).all()
    deq = kf.float() * ks[:, None]
    assert ((deq - keys).abs() <= keys.abs().amax(-1, keepdim=True) / 16).all()
    q, w = torch.randn(6, 4, 16, generator=g), torch.randn(6, 4, generator=g)
    ref = indexer_scores_ref(q, deq, w, 0.25)
    assert_close("fp8 scores", ref, indexer_scores_fp8_ref(q, kf, ks, w, 0.25), "fp32")


@pytest.mark.parametrize("pos,expect_tail", [
    pytest.param(0, [0, -1, -1], id="first-token-no-pool"),
    pytest.param(2, [0, 1, 2], id="three-tail-no-pool"),
    pytest.param(3, [-1, -1, -1], id="completes-pool-0"),
    pytest.param(41, [40, 41, -1], id="two-tail"),
])
def test_select_adversarial_rows(pos, expect_tail):
    num_pools, k, kp = 12, 4, 4
    scores = torch.randn(1, num_pools, generator=torch.Generator().manual_seed(pos))
    out = select_ref(scores, torch.tensor([pos]), k, kp, select_tail=True)[0]
    assert out.shape == (k * kp + kp - 1,) and out[-3:].tolist() == expect_tail
    visible = candidate_mask(torch.tensor([pos]), num_pools, kp)[0]
    chosen = out[: k * kp]
    chosen = chosen[chosen >= 0]
    assert len(chosen) == kp * min(k, int(visible.sum()))  # fewer candidates than k: all of them
    assert (chosen <= pos).all() and len(set(chosen.tolist())) == len(chosen)
