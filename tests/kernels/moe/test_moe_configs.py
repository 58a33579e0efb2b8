"""Config tables: the pure choice function, the JSON files, the search spaces, shipped tables."""

from __future__ import annotations

import json

import pytest

from glmlab.kernels.moe.configs import (
    CONFIG_DIR,
    DEFAULT_CONFIG,
    SMEM_LIMIT,
    ConfigTable,
    KernelConfig,
    MoEShape,
    choose_config,
    fit_stages,
    merge_tables,
    read_table,
    save_table,
    table_filename,
)
from glmlab.kernels.moe.tuner import REDUCED, SearchSpace

GLM = MoEShape(288, 8, 4096, 2048)


def test_choose_config_nearest_key_and_default():
    a, b = KernelConfig(16, 64), KernelConfig(64, 256, num_warps=8)
    table = ConfigTable({1: a, 1024: b}, {1: KernelConfig(16, 128), 1024: b})
    assert choose_config(3, table) == (a, KernelConfig(16, 128))
    assert choose_config(512, table)[0] == a  # 511 vs 512 away: the nearer, 1
    assert choose_config(513, table)[0] == b
    assert choose_config(100_000, table)[0] == b
    assert choose_config(7, None) == (DEFAULT_CONFIG, DEFAULT_CONFIG)
    only_up = ConfigTable({8: a}, {})
    assert choose_config(8, only_up) == (a, a)


def test_table_rejects_different_block_m():
    with pytest.raises(ValueError, match="BLOCK_SIZE_M"):
        ConfigTable({8: KernelConfig(16)}, {8: KernelConfig(32)})


def test_save_read_round_trip(tmp_path):
    table = ConfigTable({1: KernelConfig(16, 64), 8192: KernelConfig(128, 256, 128, 16, 8, 3)},
                        {1: KernelConfig(16, 128), 8192: KernelConfig(128, 128)},
                        meta={"samples": "test"})
    up, down = save_table(table, GLM, "NVIDIA H200", tmp_path)
    assert up.name == "moe-up-E288-A8-D4096-I2048-fp8w8a8-b128x128-NVIDIA_H200.json"
    assert down.name == table_filename("down", GLM, "NVIDIA H200")
    doc = json.loads(up.read_text())
    assert doc["configs"]["8192"] == {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256,
                                      "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16, "num_warps": 8,
                                      "num_stages": 3}
    back = read_table(GLM, "NVIDIA H200", tmp_path)
    assert back == table and back.meta == {"samples": "test"}
    assert read_table(GLM, "NVIDIA H100", tmp_path) is None


def test_search_spaces_are_valid_for_block_fp8():
    full = SearchSpace.product()
    for space in (full, REDUCED):
        assert all(128 % c.block_k == 0 and c.smem_bytes(1) <= 232448 for c in space.configs)
    assert len(set(REDUCED.configs)) == len(REDUCED.configs) and REDUCED.block_ms == [16, 32, 64,
                                                                                        128]
    assert len(full.configs) > 500


def test_shipped_tables_parse():
    paths = sorted(CONFIG_DIR.glob("moe-up-*.json"))
    for up in paths:
        doc = json.loads(up.read_text())
        shape = MoEShape(**{**doc["shape"], "block": tuple(doc["shape"]["block"])})
        table = read_table(shape, doc["device"])
        assert table is not None and table.up and set(table.up) == set(table.down)


def test_merge_tables_updates_only_the_new_m():
    base = ConfigTable({1: KernelConfig(16), 1024: KernelConfig(64)},
                       {1: KernelConfig(16), 1024: KernelConfig(64)}, meta={"space": "reduced"})
    new = ConfigTable({1024: KernelConfig(128, 256)}, {1024: KernelConfig(128)},
                      meta={"space": "wide"})
    merged = merge_tables(base, new)
    assert merged.up == {1: KernelConfig(16), 1024: KernelConfig(128, 256)}
    assert merged.meta["space"] == "reduced" and merged.meta["updated"]["space"] == "wide"
    assert merge_tables(None, new) is new


def test_fit_stages_keeps_fp8_tiles_and_trims_wide_operands():
    # The H200 rejected the default tiles over the tiny model's fp32 weights: 3 stages of
    # (64 + 128) x 128 x 4 B = 288 KiB > 227 KiB of shared memory per CTA.
    assert fit_stages(DEFAULT_CONFIG, 1) is DEFAULT_CONFIG
    assert fit_stages(DEFAULT_CONFIG, 2) is DEFAULT_CONFIG  # 144 KiB fits
    fp32 = fit_stages(DEFAULT_CONFIG, 4)
    assert fp32.num_stages == 2 and fp32.smem_bytes(4) <= SMEM_LIMIT
    huge = KernelConfig(block_m=256, block_n=256, block_k=128, num_stages=5)
    assert fit_stages(huge, 4).num_stages == 1  # never below one stage
