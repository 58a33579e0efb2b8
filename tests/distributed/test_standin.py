"""Rank emulation: a stand-in process group that records, against real gloo ranks.

The recorder must see exactly the collectives (kind and bytes, in order) that a real 2-rank gloo
run asks its process group for, as observed by the torch profiler, for a TP/EP engine step with
the MTP layer, a TP DFlash2 draft forward and an interleaved CP prefill of the tiny model; and the
TP draft on real ranks must equal the unsplit draft.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from glmlab.distributed.draft_tp import draft_shard_config
from glmlab.distributed.interleave import _all_gather, _reduce_scatter
from glmlab.distributed.parallel import ParallelLayout, launch
from glmlab.distributed.standin import CollectiveRecorder, StandInGroup, emulated_groups
from glmlab.distributed.standin_check import (
    draft_forward,
    draft_inputs,
    real_rank,
    standin_rank,
    unsplit_draft,
)


def test_standin_collectives_keep_what_one_rank_knows():
    rec = CollectiveRecorder()
    g = StandInGroup(2, 4, rec)
    t = torch.arange(6.0)
    with rec.scope("verify"):
        dist.all_reduce(t, group=g)
    assert torch.equal(t, torch.arange(6.0))  # a partial sum stays partial
    out = torch.full((12,), float("nan"))
    _all_gather(out, torch.tensor([1.0, 2.0, 3.0]), group=g)
    assert torch.equal(out, torch.tensor([1.0, 2.0, 3.0]).repeat(4))
    part = torch.zeros(3)
    _reduce_scatter(part, torch.arange(12.0), group=g)
    assert torch.equal(part, torch.tensor([6.0, 7.0, 8.0]))  # rank 2's block, unreduced
    with rec.paused():
        dist.all_reduce(t, group=g)
    assert [(c.kind, c.bytes, c.ranks, c.phase) for c in rec.calls] == [
        ("all_reduce", 24, 4, "verify"), ("all_gather", 48, 4, ""), ("reduce_scatter", 48, 4, "")]
    assert CollectiveRecorder.summary(rec.take())["all_gather"] == {"count": 1, "bytes": 48}
    assert rec.calls == []


def test_emulated_groups_place_the_rank_like_build():
    rec = CollectiveRecorder()
    g = emulated_groups(ParallelLayout(cp=4, tp=4, ep=4), 3, rec)
    assert (g.info.tp_rank, g.info.cp_rank, g.info.world_size) == (3, 3, 4)
    assert g.tp is g.cp is g.ep and g.tp.size() == 4 and g.tp.rank() == 3
    single = emulated_groups(ParallelLayout(tp=2, ep=1), 1, rec)
    assert single.ep is None and single.cp is None and single.tp.rank() == 1
    with pytest.raises(ValueError):
        emulated_groups(ParallelLayout(tp=4), 4, rec)


def test_draft_split_keeps_or_replicates_kv_heads():
    cfg = unsplit_draft().cfg  # 4 heads, 2 KV heads
    local, first = draft_shard_config(cfg, 1, 2)
    assert (local.num_heads, local.num_kv_heads, first) == (2, 1, 1)
    local, first = draft_shard_config(cfg, 3, 4)  # 2 KV heads over 4 ranks: replicated
    assert (local.num_heads, local.num_kv_heads, first) == (1, 1, 1)


def test_recorder_sees_what_two_gloo_ranks_move():
    layout = ParallelLayout(cp=2, tp=2, ep=2)
    real = launch(real_rank, 2, layout)
    for rank in (0, 1):
        seen = real[rank]["calls"]
        assert {k for k, _ in seen} == {"all_reduce", "all_gather", "reduce_scatter"}
        assert standin_rank(layout, rank) == seen
    draft = unsplit_draft()
    ref = draft_forward(draft, draft_inputs(draft))
    for r in real:  # the split draft, with its all-reduces, is the unsplit one
        torch.testing.assert_close(r["draft_out"], ref, rtol=1e-5, atol=1e-5)
