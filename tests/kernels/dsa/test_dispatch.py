"""The Partial kernel's tile rule is a pure function of architecture, KV layout and parallelism."""

from __future__ import annotations

import pytest

from glmlab.kernels.dsa.dispatch import (
    H200,
    SM90_SMEM_PER_CTA,
    GpuArch,
    Schedule,
    SparseMlaConfig,
    choose_block,
    choose_block_v1,
    smem_bytes,
    tile_iterations,
)
from glmlab.kernels.dsa.layout import BF16_512, FP8_RAW_512, FP8_SCALED_512, KVFormat, MlaKVLayout

A100 = GpuArch(8, 0, 108)


def test_reference_iteration_counts():
    assert tile_iterations(2112, 32) == 66
    assert tile_iterations(2112, 128) == 17  # the last tile is half virtual padding
    assert tile_iterations(2051, 128) == 17 and tile_iterations(1, 128) == 1


@pytest.mark.parametrize("arch,layout,rows,heads,block,hpc,splits", [
    pytest.param(H200, FP8_RAW_512, 1024, 64, 128, 64, 1, id="M1024-64heads-wide-tiles"),
    pytest.param(H200, BF16_512, 768, 64, 128, 64, 1, id="bf16-64heads-wide-too"),
    pytest.param(H200, FP8_SCALED_512, 128, 64, 128, 64, 2, id="M128-64heads-two-splits"),
    pytest.param(H200, FP8_RAW_512, 1024, 16, 32, 16, 1, id="TP4-rank-16heads-stays-32"),
    pytest.param(H200, FP8_RAW_512, 1000, 16, 32, 16, 1, id="nearby-M-same-choice"),
    pytest.param(H200, FP8_RAW_512, 128, 16, 32, 16, 2, id="M128-16heads-too-few-ctas"),
    pytest.param(A100, FP8_RAW_512, 1024, 64, 32, 64, 1, id="not-sm90"),
    pytest.param(H200, MlaKVLayout(KVFormat.BF16, 1024), 1024, 64, 32, 64, 1,
                 id="rank-1024-wide-tile-does-not-fit"),
    pytest.param(H200, FP8_RAW_512, 1, 16, 32, 16, 16, id="decode-one-row-max-splits"),
    pytest.param(H200, FP8_RAW_512, 3, 2, 32, 16, 16, id="tiny-heads-padded-to-16"),
])
def test_rule_v1(arch, layout, rows, heads, block, hpc, splits):
    cfg = choose_block_v1(arch, layout, rows, heads)
    assert (cfg.block_i, cfg.heads_per_cta, cfg.num_splits) == (block, hpc, splits), cfg.describe()
    assert cfg.threads == (256 if hpc == 64 else 128) and cfg.schedule is Schedule.SERIAL
    assert str(block) in cfg.describe()


PIPE = Schedule.PIPELINED


@pytest.mark.parametrize("arch,layout,rows,heads,schedule,hpc,splits", [
    pytest.param(H200, BF16_512, 1056, 16, PIPE, 16, 1, id="decode-verify-TP4-pipelined"),
    pytest.param(H200, BF16_512, 32768, 64, PIPE, 64, 1, id="prefill-64heads-pipelined"),
    pytest.param(H200, BF16_512, 128, 16, PIPE, 16, 1, id="M128-one-wave-no-split"),
    pytest.param(H200, BF16_512, 40, 16, PIPE, 16, 3, id="few-rows-fill-one-wave"),
    pytest.param(H200, BF16_512, 1, 64, PIPE, 64, 16, id="one-row-max-splits"),
    pytest.param(H200, FP8_SCALED_512, 32768, 64, Schedule.SERIAL, 64, 1, id="fp8-first-gen"),
    pytest.param(H200, FP8_RAW_512, 64, 16, Schedule.SERIAL, 16, 4, id="fp8-v1-splits"),
    pytest.param(H200, MlaKVLayout(KVFormat.BF16, 64), 5, 16, Schedule.SERIAL, 16, 16,
                 id="small-rank-first-generation"),
    pytest.param(A100, BF16_512, 1024, 64, Schedule.SERIAL, 64, 1, id="not-sm90"),
])
def test_rule(arch, layout, rows, heads, schedule, hpc, splits):
    cfg = choose_block(arch, layout, rows, heads)
    assert (cfg.schedule, cfg.heads_per_cta, cfg.num_splits) == (schedule, hpc, splits)
    if schedule is PIPE:
        assert (cfg.block_i, cfg.stages, cfg.threads) == (64, 2, 256 if hpc == 64 else 128)
        assert cfg.name == f"pipelined-b64-h{hpc}-s2"


def test_forced_choices_and_validation():
    cfg = choose_block(H200, BF16_512, 1024, 64, block_i=128, heads_per_cta=16)
    assert (cfg.block_i, cfg.heads_per_cta, cfg.num_splits) == (128, 16, 1)
    assert smem_bytes(512, 128, 64) <= SM90_SMEM_PER_CTA < smem_bytes(1024, 128, 64)
    with pytest.raises(ValueError):
        SparseMlaConfig(block_i=48, heads_per_cta=16, num_splits=1, threads=128)
    with pytest.raises(ValueError):
        SparseMlaConfig(block_i=32, heads_per_cta=16, num_splits=0, threads=128)
    with pytest.raises(ValueError, match="384"):
        SparseMlaConfig(64, 64, 1, 256, Schedule.WS, 2)
    with pytest.raises(ValueError, match="64-head CTAs over 64-column"):
        SparseMlaConfig(128, 64, 1, 384, Schedule.WS, 2)
    with pytest.raises(ValueError, match="64-head CTAs"):
        SparseMlaConfig(64, 16, 1, 384, Schedule.WS, 2)
    with pytest.raises(ValueError, match="256 threads"):
        SparseMlaConfig(64, 64, 1, 128, PIPE, 2)
    cfg = choose_block(H200, FP8_RAW_512, 1056, 16, schedule=Schedule.WS)
    assert (cfg.heads_per_cta, cfg.threads, cfg.name) == (64, 384, "ws-b64-h64")
    cfg = choose_block(H200, BF16_512, 8192, 16, schedule=PIPE, threads=256)
    assert (cfg.threads, cfg.stages, cfg.name) == (256, 2, "pipelined-b64-h16-s2-t256")
