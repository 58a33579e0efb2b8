"""A rank's random shard drawn in place equals the written checkpoint, loaded and sharded.

Two ranks (gloo): the tiny model with FP8 dequantised at load, and a small config whose splits
fall on 128-wide FP8 blocks with FP8 kept (the full-size path: E4M3 weights and scales sliced).
"""

from __future__ import annotations

import pytest
import torch

from glmlab import presets
from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.writer import write_random_checkpoint
from glmlab.distributed.parallel import ParallelLayout, ProcessGroups, launch
from glmlab.distributed.random_shard import random_tp_model
from glmlab.distributed.tp import apply_tp

SEED = 5


def aligned_config() -> dict:
    """Two layers whose every TP2 split is a multiple of the 128-wide FP8 block."""
    cfg = presets.tiny(fp8=True)
    t = cfg["text_config"]
    t.update(hidden_size=256, intermediate_size=256, moe_intermediate_size=256,
             num_hidden_layers=2, layer_types=["linear_attention", "deepseek_sparse_attention"],
             mlp_layer_types=["dense", "sparse"], indexer_types=["full"] * 2,
             q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=128, v_head_dim=128,
             n_routed_experts=4)
    t["linear_attn_config"]["head_dim"] = 32
    return cfg


def _tensors(model) -> dict[str, torch.Tensor]:
    out = {n: p.detach() for n, p in model.named_parameters()}
    out.update({n: b for n, b in model.named_buffers() if b is not None})
    return {n: (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t)
            for n, t in out.items()}


def _compare(path: str, config: dict, fp8: bool, mode: str) -> list[str]:
    groups = ProcessGroups.build(ParallelLayout(tp=2, ep=2))
    loaded = apply_tp(load_model(path, dtype=torch.float32, fp8=mode), groups)
    drawn = random_tp_model(config, groups, seed=SEED, fp8=fp8, fp8_mode=mode,
                            dtype=torch.float32)
    a, b = _tensors(loaded), _tensors(drawn)
    bad = sorted(set(a) ^ set(b))
    bad += [n for n in sorted(set(a) & set(b))
            if a[n].dtype != b[n].dtype or not torch.equal(a[n], b[n])]
    return bad + ([] if loaded.cfg == drawn.cfg else ["cfg"])


def _rank_work(cases: list) -> list[list[str]]:
    torch.set_num_threads(1)
    return [_compare(*case) for case in cases]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cases = []
    for name, config, fp8, mode in (("tiny", presets.tiny(), False, "dequantize"),
                                    ("tiny-fp8", presets.tiny(fp8=True), True, "dequantize"),
                                    ("aligned-fp8", aligned_config(), True, "keep")):
        path = write_random_checkpoint(config, tmp_path_factory.mktemp(name), seed=SEED, fp8=fp8)
        cases.append((str(path), config, fp8, mode))
    return launch(_rank_work, 2, cases, backend="gloo")


@pytest.mark.parametrize("case", range(3), ids=["tiny", "tiny-fp8-dequantized", "aligned-fp8-kept"])
def test_drawn_shard_equals_loaded_shard(results, case):
    for rank in range(2):
        assert results[rank][case] == [], f"rank {rank}: differs at {results[rank][case][:5]}"
