"""The Partial kernel's tile rule is a pure function of architecture, KV layout and parallelism."""

from __future__ import annotations

import pytest

from glmlab.kernels.dsa.dispatch import (
    H200,
    GpuArch,
    SparseMlaConfig,
    choose_block,
    tile_iterations,
)
from glmlab.kernels.dsa.layout import BF16_512, FP8_RAW_512, FP8_SCALED_512

A100 = GpuArch(8, 0, 108)


def test_seed_iteration_counts():
    assert tile_iterations(2112, 32) == 66
    assert tile_iterations(2112, 128) == 17  # the last tile is half virtual padding
    assert tile_iterations(2051, 128) == 17 and tile_iterations(1, 128) == 1


@pytest.mark.parametrize("arch,layout,rows,heads,block,hpc,splits", [
    pytest.param(H200, FP8_RAW_512, 1024, 16, 128, 16, 1, id="seed-M1024-TP4-fp8"),
    pytest.param(H200, FP8_SCALED_512, 768, 16, 128, 16, 1, id="M768-scaled"),
    pytest.param(H200, FP8_RAW_512, 1000, 16, 128, 16, 1, id="nearby-M-same-choice"),
    pytest.param(H200, FP8_RAW_512, 128, 16, 32, 16, 2, id="M128-too-few-ctas"),
    pytest.param(H200, FP8_RAW_512, 128, 64, 32, 64, 2, id="M128-64heads-one-cta-per-row"),
    pytest.param(H200, FP8_RAW_512, 768, 64, 128, 64, 1, id="M768-64heads"),
    pytest.param(H200, BF16_512, 1024, 16, 32, 16, 1, id="bf16-stays-32"),
    pytest.param(A100, FP8_RAW_512, 1024, 16, 32, 16, 1, id="not-sm90"),
    pytest.param(H200, FP8_RAW_512, 1, 16, 32, 16, 16, id="decode-one-row-max-splits"),
    pytest.param(H200, FP8_RAW_512, 3, 2, 32, 16, 16, id="tiny-heads-padded-to-16"),
])
def test_rule(arch, layout, rows, heads, block, hpc, splits):
    cfg = choose_block(arch, layout, rows, heads)
    assert (cfg.block_i, cfg.heads_per_cta, cfg.num_splits) == (block, hpc, splits), cfg.describe()
    assert cfg.threads == (256 if hpc == 64 else 128)
    assert str(block) in cfg.describe()


def test_forced_choices_and_validation():
    cfg = choose_block(H200, BF16_512, 1024, 64, block_i=128, heads_per_cta=16)
    assert (cfg.block_i, cfg.heads_per_cta, cfg.num_splits) == (128, 16, 1)
    with pytest.raises(ValueError):
        SparseMlaConfig(block_i=48, heads_per_cta=16, num_splits=1, threads=128)
    with pytest.raises(ValueError):
        SparseMlaConfig(block_i=32, heads_per_cta=16, num_splits=0, threads=128)
