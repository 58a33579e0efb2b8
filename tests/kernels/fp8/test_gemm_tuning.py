"""Tuned tables of the block-FP8 dense GEMM: the table format and lookup, the search space, and a
tuning run under the CPU interpreter (times there only show that the code runs)."""

from __future__ import annotations

import pytest
import torch

from glmlab.commands.tune_linear_fp8 import model_shapes
from glmlab.kernels.fp8.gemm_configs import (
    GEMV_MAX_M,
    GemmConfig,
    GemmTable,
    choose_config,
    read_table,
    rule_config,
    save_table,
    scaled_mm_config,
)
from glmlab.kernels.fp8.tuner import GEMV_TUNE_MAX_M, SMEM_LIMIT, candidates, tune_shape
from glmlab.kernels.moe.timing import WallTimer

A = GemmConfig(16, 64, 2, swap_ab=True, fuse_quant=True)
B = GemmConfig(64, 128, 1, swap_ab=False, fuse_quant=False, num_warps=8, num_stages=3)
V = GemmConfig(4, 32, 8, swap_ab=False, fuse_quant=False, num_warps=8, num_stages=1, block_k=512,
               kind="gemv")


def test_table_lookup_takes_the_nearest_tuned_m_and_falls_back_to_the_rule():
    table = GemmTable({(8192, 4096): {1: A, 128: B}})
    assert choose_config(1, 8192, 4096, table=table) == A
    assert choose_config(40, 8192, 4096, table=table) == A  # 1 is nearer than 128
    assert choose_config(100, 8192, 4096, table=table) == B
    assert choose_config(64, 8192, 4096, table=table) == A  # ... ties went to the smaller M
    assert choose_config(128, 4096, 4096, table=table) == rule_config(128, 4096, 4096)


def test_table_round_trip_and_merge(tmp_path):
    table = GemmTable({(8192, 4096): {1: A}}, {"tokens": [1]})
    path = save_table(table, "NVIDIA H200", tmp_path)
    assert path.name == "linear-fp8-NVIDIA_H200.json"
    back = read_table("NVIDIA H200", tmp_path)
    assert back == table and read_table("other", tmp_path) is None
    merged = back.merged(GemmTable({(8192, 4096): {128: B}, (1, 2): {1: B}}))
    assert merged.entries[(8192, 4096)] == {1: A, 128: B} and merged.entries[(1, 2)] == {1: B}
    assert merged.meta["tokens"] == [1, 128]  # a partial re-tune keeps naming every M held


def test_tables_written_before_kinds_still_load():
    """An entry without ``kind`` (every table tuned before the GEMV) is the tensor-core kernel."""
    old = {"format": "glmlab-linear-fp8-configs/1", "device": "NVIDIA H200", "meta": {},
           "configs": {"8192x4096": {"1": {"block_m": 16, "block_n": 64, "split_k": 2,
                                           "swap_ab": True, "fuse_quant": True, "num_warps": 4,
                                           "num_stages": 4, "block_k": 128}}}}
    assert GemmTable.from_json(old).entries == {(8192, 4096): {1: A}}
    shipped = read_table("NVIDIA H200")  # the package's table, as the H200 tuner last wrote it
    assert shipped is not None and shipped.entries
    assert all(c.kind in ("mma", "gemv", "scaled_mm") for by_m in shipped.entries.values()
               for c in by_m.values())


def test_gemv_and_scaled_mm_entries_round_trip(tmp_path):
    table = GemmTable({(4096, 16384): {1: V, 128: scaled_mm_config()}, (8192, 4096): {1: A}})
    save_table(table, "NVIDIA H200", tmp_path)
    back = read_table("NVIDIA H200", tmp_path)
    assert back == table and back.entries[(4096, 16384)][1].kind == "gemv"
    assert back.entries[(4096, 16384)][128] == scaled_mm_config()


def test_choose_config_takes_the_gemv_only_from_the_table_or_the_rule():
    table = GemmTable({(4096, 16384): {1: V}, (8192, 4096): {1: A, 128: B}})
    assert choose_config(1, 4096, 16384, table=table) == V  # the table says so
    assert choose_config(2, 8192, 4096, table=table) == A  # the table says otherwise
    assert choose_config(GEMV_MAX_M, 4096, 4096, table=table).kind == "gemv"  # untuned: rule
    assert choose_config(GEMV_MAX_M + 1, 4096, 4096, table=table).kind == "mma"
    assert choose_config(128, 4096, 4096).kind == "mma"


@pytest.mark.parametrize("m", [1, 4, 8, 64, 128, 256, 1056, 8192])
def test_candidates_fit_shared_memory_and_include_the_rule(m):
    space = candidates(m, 24576, 4096)
    assert rule_config(m, 24576, 4096) in space and len(space) == len(set(space))
    assert all(c.smem_bytes(2) <= SMEM_LIMIT for c in space)
    gemv = [c for c in space if c.kind == "gemv"]
    assert bool(gemv) == (m <= GEMV_TUNE_MAX_M)  # beside the tensor-core candidates
    assert any(c.kind == "mma" for c in space)
    if gemv:
        assert {c.fuse_quant for c in gemv} == {True, False}
        assert len({(c.block_n, c.block_k, c.num_warps, c.split_k) for c in gemv}) >= 6
        assert all(c.block_m >= m and 8 * c.split_k * m * 24576 <= 24576 * 4096 for c in gemv)
    assert space.count(scaled_mm_config()) == 1  # the library peer at every M
    assert scaled_mm_config() not in candidates(m, 200, 4096)  # N not in whole 128-blocks


def test_model_shapes_are_the_fused_calls_of_the_fast_forward():
    shapes = model_shapes("slice:4")
    # gate|up of the dense MLP (2 x 12288), its down fed E4M3, the DSA q_a|kv_a (1536 + 512)
    assert (24576, 4096, False) in shapes and (4096, 12288, True) in shapes
    assert (2048, 4096, False) in shapes and (16384, 1536, False) in shapes
    assert not any(n == 12288 for n, _, _ in shapes)  # gate and up are never called alone


@pytest.mark.parametrize("act_fp8", [False, True])
def test_tuning_under_the_interpreter_picks_a_correct_config(act_fp8):
    res = tune_shape(5, 128, 256, WallTimer(), device="cpu", dtype=torch.float32,
                     act_fp8=act_fp8, configs=[A, GemmConfig(16, 64, 1, True, True)])
    assert len(res.timings) == 2 and res.best_rel_err < 1e-2
    assert res.timings[0].us <= res.timings[1].us  # both are right: the faster comes first


def test_tuning_times_the_gemv_beside_the_tensor_core_kernel():
    res = tune_shape(2, 128, 640, WallTimer(), device="cpu", dtype=torch.float32,
                     configs=[A, V])
    assert {t.config.kind for t in res.timings} == {"mma", "gemv"} and res.best_rel_err < 1e-2
    assert res.best_of("gemv").config == V and res.best_of("mma").config == A
