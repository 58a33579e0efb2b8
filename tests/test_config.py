"""ModelConfig.from_hf: real values, presets, HF variants, clear errors for unsupported configs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from glmlab import presets
from glmlab.config import ConfigError, FfnType, LayerType, ModelConfig

ROOT = Path(__file__).resolve().parents[1]


def test_full_config_matches_model_md():
    cfg = ModelConfig.from_hf(ROOT / "data/configs/glm-5.3-flash/config.json")
    assert cfg.num_layers == 45 and cfg.mtp_layer == 45
    assert len(cfg.kda_layers) == 34 and cfg.dsa_layers == tuple(range(3, 45, 4))
    assert cfg.ffn_types[:3] == (FfnType.DENSE,) * 3 and set(cfg.ffn_types[3:]) == {FfnType.MOE}
    assert (cfg.kda.num_heads, cfg.kda.head_dim, cfg.kda.conv_kernel, cfg.kda.lower_bound) == (
        64,
        128,
        4,
        -5.0,
    )
    d = cfg.dsa
    assert (d.num_heads, d.q_lora_rank, d.kv_lora_rank, d.qk_nope_head_dim, d.v_head_dim) == (
        64,
        1536,
        512,
        256,
        256,
    )
    assert (d.index_n_heads, d.index_head_dim, d.index_topk, d.index_kpool) == (32, 128, 2048, 4)
    assert d.topk_pools == 512 and d.max_selected == 2051 and d.softmax_scale == 1 / 16
    m = cfg.moe
    assert (m.num_experts, m.top_k, m.num_shared, m.intermediate_size, m.routed_scaling) == (
        288,
        8,
        1,
        2048,
        2.5,
    )
    assert (cfg.mhc.num_streams, cfg.mhc.sinkhorn_iters, cfg.mhc.eps) == (4, 20, 1e-6)
    assert cfg.fp8 is not None and cfg.fp8.block == (128, 128)
    assert cfg.vocab_size == 154880 and not cfg.tie_word_embeddings and cfg.swiglu_limit == 10.0


@pytest.mark.parametrize("name", ["glm-5.3-flash", "tiny"])
def test_shipped_configs_equal_presets(name):
    on_disk = json.loads((ROOT / f"data/configs/{name}/config.json").read_text())
    assert on_disk == (presets.full() if name == "glm-5.3-flash" else presets.tiny())


def test_tiny_keeps_every_family_and_sparse_selection_is_reachable():
    cfg = presets.preset_config("tiny")
    assert {LayerType.KDA, LayerType.DSA} <= set(cfg.layer_types)
    assert {FfnType.DENSE, FfnType.MOE} <= set(cfg.ffn_types)
    assert cfg.mtp_layer is not None and cfg.mhc.num_streams == 4 and cfg.dsa.index_kpool == 4
    assert cfg.dsa.index_topk <= 32  # a few dozen tokens already select sparsely


def test_slice_keeps_widths_and_pattern():
    full = presets.preset_config("full")
    cfg = ModelConfig.from_hf(presets.slice_(8))
    assert cfg.layer_types == full.layer_types[:8] and cfg.ffn_types == full.ffn_types[:8]
    assert (cfg.hidden_size, cfg.moe.num_experts, cfg.dsa.num_heads) == (4096, 288, 64)
    assert full.with_layers(8).layer_types == cfg.layer_types


def test_flat_text_config_and_hf_field_names():
    nested = presets.tiny()
    flat = dict(nested["text_config"])
    # transformers' own field names instead of the nested linear_attn_config
    kda = flat.pop("linear_attn_config")
    flat.update(
        linear_num_heads=kda["num_heads"],
        linear_head_dim=kda["head_dim"],
        linear_conv_kernel_dim=kda["short_conv_kernel_size"],
        linear_lower_bound=kda["gate_lower_bound"],
    )
    flat["layer_types"] = [
        "indexed_attention" if t != "linear_attention" else t for t in flat["layer_types"]
    ]
    a, b = ModelConfig.from_hf(nested), ModelConfig.from_hf(flat)
    assert a == b


def test_config_written_by_transformers_reads_back(tmp_path):
    from transformers import Glm5NextConfig

    text = dict(presets.tiny()["text_config"])
    hf = Glm5NextConfig(text_config=text, vision_config=presets.tiny()["vision_config"])
    hf.save_pretrained(tmp_path)
    cfg = ModelConfig.from_hf(tmp_path)
    assert cfg == presets.preset_config("tiny")


def test_config_is_frozen():
    cfg = presets.preset_config("tiny")
    with pytest.raises(AttributeError):
        cfg.hidden_size = 3  # type: ignore[misc]


def _broken(**changes):
    cfg = copy.deepcopy(presets.tiny())
    for k, v in changes.items():
        if v is None:
            cfg["text_config"].pop(k)
        else:
            cfg["text_config"][k] = v
    return cfg


@pytest.mark.parametrize(
    "changes, message",
    [
        pytest.param({"qk_rope_head_dim": 64}, "no RoPE", id="rope"),
        pytest.param({"num_key_value_heads": 1}, "num_key_value_heads", id="gqa"),
        pytest.param({"index_topk": 18}, "divisible by index_kpool", id="topk-kpool"),
        pytest.param(
            {"indexer_types": ["full", "full", "full", "shared"]}, "only 'full'", id="shared"
        ),
        pytest.param({"mhc": False}, "mhc=false", id="mhc-off"),
        pytest.param({"hidden_size": None}, "hidden_size", id="missing-field"),
        pytest.param(
            {"layer_types": ["linear_attention"] * 3 + ["sliding_window"]},
            "sliding_window",
            id="unknown-layer",
        ),
        pytest.param(
            {"layer_types": ["linear_attention"]}, "num_hidden_layers=4", id="short-schedule"
        ),
        pytest.param({"mlp_layer_types": ["dense"]}, "mlp_layer_types", id="short-mlp-schedule"),
        pytest.param({"n_group": 8, "topk_group": 4}, "group-limited", id="group-routing"),
        pytest.param({"scoring_func": "softmax"}, "sigmoid", id="softmax-router"),
        pytest.param({"num_experts_per_tok": 99}, "exceeds", id="topk-experts"),
        pytest.param({"hidden_act": "gelu"}, "silu", id="act"),
        pytest.param({"q_lora_rank": None}, "q_lora_rank", id="no-q-lora"),
        pytest.param({"num_nextn_predict_layers": 3}, "0 or 1", id="mtp-layers"),
    ],
)
def test_unsupported_configs_fail_clearly(changes, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_hf(_broken(**changes))


def test_bad_quantization_and_files(tmp_path):
    cfg = presets.tiny(fp8=True)
    cfg["quantization_config"]["quant_method"] = "gptq"
    with pytest.raises(ConfigError, match="fp8"):
        ModelConfig.from_hf(cfg)
    with pytest.raises(ConfigError, match="no config.json"):
        ModelConfig.from_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_hf(tmp_path)
