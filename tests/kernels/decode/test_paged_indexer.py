"""Paged DSA indexer of a uniform step (kernels/decode/indexer_triton.py) against
kernels/decode/ref.py, and that reference against the model's own per-sequence selection
(kernels/dsa/ref.py select_ref) on the same pools. fp32 under the CPU interpreter; selections are
compared as sets (the kernel writes pools in pool order, select_ref in score order)."""

from __future__ import annotations

import pytest
import torch

from glmlab.kernels.decode.indexer_triton import index_select, pool_update
from glmlab.kernels.decode.ref import index_select_ref, pool_update_ref, token_slots
from glmlab.kernels.dsa.ref import indexer_scores_ref, select_ref
from glmlab.kernels.fp8.ref import FP8

DEV = "cuda" if torch.cuda.is_available() else "cpu"
KPOOL, S, DI, HI, TOPK = 4, 8, 16, 8, 3


def _table(n_seq, pages, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n_seq * pages + 1, generator=g)[: n_seq * pages].view(n_seq, pages)


def _rows(t, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, DI, generator=g), torch.randn(t, DI, generator=g)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("n", [1, 5])
def test_pool_update_matches_reference(n, fp8):
    n_seq, pages = 3, 4
    table = _table(n_seq, pages, seed=n).to(DEV)
    starts = torch.tensor([0, 7, 13])  # held 0 / 3 / 1 rows; pools complete inside the step
    positions = (starts[:, None] + torch.arange(n)).flatten().to(DEV)
    k, gate = (x.to(DEV) for x in _rows(n_seq * n, seed=n))
    slots = torch.tensor([4, 0, 2], device=DEV)
    tail = torch.randn(6, KPOOL, 2 * DI, device=DEV)
    num_pools = (n_seq * pages + 1) * S // KPOOL
    keys = torch.zeros(num_pools, DI, device=DEV, dtype=FP8 if fp8 else torch.float32)
    scales = torch.zeros(num_pools, device=DEV) if fp8 else None
    ape = torch.randn(KPOOL, DI, device=DEV) * 0.5
    ref = [tail.clone(), keys.clone(), None if scales is None else scales.clone()]
    pool_update_ref(k, gate, ref[0], ref[1], ref[2], ape, slots, positions, table, S)
    pool_update(k, gate, tail, keys, scales, ape, slots, positions, table, S)
    for i, (start, slot) in enumerate(zip(starts.tolist(), slots.tolist(), strict=True)):
        live = (start + n) % KPOOL  # valid rows of the tail after the step
        assert torch.allclose(tail[slot, :live], ref[0][slot, :live], atol=1e-6), i
    assert torch.allclose(keys.float(), ref[1].float(), rtol=1e-5, atol=1e-5)
    if fp8:
        assert torch.allclose(scales, ref[2], rtol=1e-6)
    assert ref[1].float().abs().sum() > 0  # pools were completed


def test_select_matches_reference_and_select_ref():
    n_seq, pages, n = 3, 4, 2
    table = _table(n_seq, pages, seed=5).to(DEV)
    starts = torch.tensor([3, 10, 29])  # first sequence keeps every pool, the others select
    positions = (starts[:, None] + torch.arange(n)).flatten().to(DEV)
    t = n_seq * n
    g = torch.Generator().manual_seed(1)
    q = torch.randn(t, HI, DI, generator=g).to(DEV)
    w = torch.randn(t, HI, generator=g).to(DEV)
    num_pools = (n_seq * pages + 1) * S // KPOOL
    keys = torch.randn(num_pools, DI, generator=g).to(DEV)
    got = index_select(q, w, keys, None, positions, table, S, KPOOL, TOPK, True, DI**-0.5, n)
    want = index_select_ref(q, w, keys, None, positions, table, S, KPOOL, TOPK, True, DI**-0.5, n)
    assert got.shape == want.shape == (t, TOPK * KPOOL + KPOOL - 1)
    for r in range(t):
        assert got[r].long().sort().values.tolist() == want[r].sort().values.tolist(), r
    # the reference is the model's selection: select_ref over the sequence's own pools
    for r in range(t):
        seq, pos = r // n, int(positions[r])
        npools = (pos + 1) // KPOOL
        pools = torch.arange(npools, device=DEV)
        pslots = token_slots(table, torch.full_like(pools, seq), pools * KPOOL, S) // KPOOL
        scores = indexer_scores_ref(q[r:r + 1], keys[pslots], w[r:r + 1], DI**-0.5)
        sel = select_ref(scores, torch.tensor([pos], device=DEV), TOPK, KPOOL, True)[0]
        model = token_slots(table, torch.full_like(sel, seq), sel, S)
        assert model.sort().values.tolist() == want[r].sort().values.tolist(), r


def test_select_with_fp8_keys_agrees_on_clear_winners():
    n_seq, pages, n = 2, 4, 1
    table = _table(n_seq, pages, seed=2).to(DEV)
    positions = torch.tensor([27, 30], device=DEV)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, HI, DI, generator=g).to(DEV)
    w = torch.rand(2, HI, generator=g).to(DEV)
    keys32 = torch.randn((n_seq * pages + 1) * S // KPOOL, DI, generator=g).to(DEV)
    scale = keys32.abs().amax(-1) / 448
    keys8 = (keys32 / scale[:, None]).to(FP8)
    got = index_select(q, w, keys8, scale, positions, table, S, KPOOL, TOPK, True, DI**-0.5, n)
    want = index_select_ref(q, w, keys8, scale, positions, table, S, KPOOL, TOPK, True,
                            DI**-0.5, n)
    for r in range(2):
        assert got[r].long().sort().values.tolist() == want[r].sort().values.tolist()
