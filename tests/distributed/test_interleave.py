"""Interleaved shards, process-group layouts and KDA head sharding, all in one process."""

from __future__ import annotations

import pytest
import torch

from glmlab.distributed.interleave import CPComm, Interleave
from glmlab.distributed.kda_tp import shard_config
from glmlab.distributed.parallel import ParallelLayout, ProcessGroups
from glmlab.presets import preset_config


@pytest.mark.parametrize("t,cp", [(8, 2), (7, 2), (13, 4), (4, 4), (5, 1)])
def test_interleave_roundtrips(t, cp):
    full = torch.arange(t * 3).view(t, 3)
    shards = [Interleave(t, cp, r) for r in range(cp)]
    for r, ilv in enumerate(shards):
        assert ilv.local_rows().tolist() == list(range(r, t, cp))
        assert ilv.local_len == len(range(r, t, cp))
        local = ilv.shard(full)
        assert local.shape[0] == ilv.padded_len == -(-t // cp)
        assert torch.equal(local[: ilv.local_len], full[r::cp])
        assert not local[ilv.local_len:].any()  # padding rows are zero
    gathered = torch.cat([ilv.shard(full) for ilv in shards])  # what an all-gather returns
    assert torch.equal(shards[0].to_sequence(gathered), full)
    assert torch.equal(shards[0].to_rank_major(full), gathered)


def test_single_rank_comm_is_identity_and_counts_bytes():
    comm = CPComm(None, 1, 0)
    x = torch.randn(5, 4)
    assert comm.all_gather(x) is x and comm.reduce_scatter(x) is x
    assert comm.gathered_bytes == comm.scattered_bytes == 5 * 4 * 4
    with pytest.raises(ValueError):
        CPComm(None, 4, 0).interleave(3)


def test_layouts():
    g = ProcessGroups.single()
    assert (g.info.cp_size, g.info.tp_size, g.info.ep_size) == (1, 1, 1) and g.cp is None
    ParallelLayout(cp=4, tp=4, ep=4).check(4)
    with pytest.raises(ValueError):
        ParallelLayout(cp=3).check(4)
    with pytest.raises(ValueError):
        ParallelLayout(tp=0)


def test_shard_config_splits_kda_heads_only():
    cfg = preset_config("full")
    local = shard_config(cfg, 4)
    assert local.kda.num_heads == 16 and local.kda.head_dim == cfg.kda.head_dim
    assert local.dsa == cfg.dsa and local.moe == cfg.moe
    with pytest.raises(ValueError):
        shard_config(cfg, 3)
