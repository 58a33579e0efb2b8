"""Tuned tables of the block-FP8 dense GEMM: the table format and lookup, the search space, and a
tuning run under the CPU interpreter (times there only show that the code runs)."""

from __future__ import annotations

import pytest
import torch

from glmlab.commands.tune_linear_fp8 import model_shapes
from glmlab.kernels.fp8.gemm_configs import (
    GemmConfig,
    GemmTable,
    choose_config,
    read_table,
    rule_config,
    save_table,
)
from glmlab.kernels.fp8.tuner import SMEM_LIMIT, candidates, tune_shape
from glmlab.kernels.moe.timing import WallTimer

A = GemmConfig(16, 64, 2, swap_ab=True, fuse_quant=True)
B = GemmConfig(64, 128, 1, swap_ab=False, fuse_quant=False, num_warps=8, num_stages=3)


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


@pytest.mark.parametrize("m", [1, 8, 64, 128, 256, 1056, 8192])
def test_candidates_fit_shared_memory_and_include_the_rule(m):
    space = candidates(m, 24576, 4096)
    assert rule_config(m, 24576, 4096) in space and len(space) == len(set(space))
    assert all(c.smem_bytes(2) <= SMEM_LIMIT for c in space)


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
