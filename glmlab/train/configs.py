"""Model configs ``glmlab train`` accepts: a preset, ``micro``, or a config.json / checkpoint dir.

``micro`` is the ``small`` preset (same 4096-token vocabulary and special ids, so it trains on the
same tokenizer) cut to four layers (KDA, KDA, KDA, DSA; dense then MoE) at width 64: a CPU
trains it for a few steps in seconds, which is what the tests and the GPU script's rehearsal use.
"""

from __future__ import annotations

import copy
from typing import Any

from glmlab import presets
from glmlab.config import ModelConfig


def micro() -> dict[str, Any]:
    cfg = copy.deepcopy(presets.small())
    cfg["text_config"].update(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["deepseek_sparse_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        indexer_types=["full"] * 4,
        linear_attn_config={"num_heads": 2, "head_dim": 16, "short_conv_kernel_size": 4,
                            "gate_lower_bound": -5.0},
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=32,
        kv_lora_rank=128,
        qk_nope_head_dim=16,
        v_head_dim=16,
        index_n_heads=4,
        index_head_dim=16,
        index_topk=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
    )
    return cfg


def model_config(spec: str) -> ModelConfig:
    """A preset name (``small``, ``tiny``, ``slice:N``), ``micro``, or a config path."""
    if spec == "micro":
        return ModelConfig.from_hf(micro())
    if spec in presets.PRESETS or spec.startswith("slice"):
        return ModelConfig.from_hf(presets.preset(spec))
    return ModelConfig.from_hf(spec)
