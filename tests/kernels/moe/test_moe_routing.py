"""Triton routing and alignment against the references (CPU interpreter, small shapes)."""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.moe.ref import moe_align_ref, route_ref
from glmlab.kernels.moe.routing_triton import align_pairs, max_padded_rows, route_topk


@pytest.mark.parametrize("t,e,a,renorm", [(13, 24, 4, True), (5, 288, 8, True), (3, 8, 2, False)])
def test_route_topk_matches_ref(t, e, a, renorm):
    gen = torch.Generator().manual_seed(t * e)
    logits = torch.randn(t, e, generator=gen) * 2
    bias = torch.randn(e, generator=gen) * 0.3  # large enough to change the selection
    w, ids = route_topk(logits, bias, a, 2.5, renorm)
    w_ref, ids_ref = route_ref(logits, bias, a, 2.5, renorm)
    order, order_ref = ids.long().sort(1), ids_ref.sort(1)
    assert torch.equal(order.values, order_ref.values)
    torch.testing.assert_close(w.gather(1, order.indices), w_ref.gather(1, order_ref.indices),
                               rtol=1e-6, atol=1e-7)
    assert (ids[:, :-1] != ids[:, 1:]).all()


def test_route_bias_steers_selection_not_weights():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 5.0, 0.0])
    w, ids = route_topk(logits, bias, 2, 1.0)
    assert sorted(ids[0].tolist()) == [0, 2]
    s = logits.sigmoid()[0]
    torch.testing.assert_close(w[0].sort().values, (s[[0, 2]] / s[[0, 2]].sum()).sort().values)


@pytest.mark.parametrize("block_m", [16, 32])
def test_align_pairs_matches_ref(block_m):
    gen = torch.Generator().manual_seed(block_m)
    e, t, a = 10, 37, 3
    ids = torch.stack([torch.randperm(e, generator=gen)[:a] for _ in range(t)])
    ids[ids == 4] = 0  # an empty expert and a heavy one
    ids[::5, 0] = -1  # pairs owned by another EP rank
    al = align_pairs(ids.int(), e, block_m)
    sorted_ref, experts_ref, n = moe_align_ref(ids, e, block_m)
    assert al.num_padded.item() == n and n <= al.max_rows
    assert al.max_rows == max_padded_rows(t * a, e, block_m)
    assert torch.equal(al.sorted_ids[:n].long(), sorted_ref)
    assert torch.equal(al.expert_ids[:n // block_m].long(), experts_ref)


def test_align_pairs_empty_and_single_token():
    al = align_pairs(torch.full((1, 8), -1, dtype=torch.int32), 72, 16)
    assert al.num_padded.item() == 0
    al = align_pairs(torch.tensor([[3, 1]]), 4, 16)
    assert al.num_padded.item() == 32
    assert al.sorted_ids[:32].tolist() == [1] + [2] * 15 + [0] + [2] * 15
