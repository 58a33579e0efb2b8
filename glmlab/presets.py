"""Named model sizes, written as Hugging Face ``config.json`` dicts.

Every preset is plain data in the published layout (multimodal config, nested ``text_config``)
so that it goes through the one reader, ``ModelConfig.from_hf``, exactly like a real checkpoint.

- ``full``: the released GLM-5.3-Flash values (docs/model.md section 1), FP8 block-128 weights.
- ``tiny``: seconds on a CPU, yet every layer family is present: KDA and DSA attention, dense and
  MoE FFNs, 4 mHC streams, the MTP layer, and an indexer top-k (16 tokens = 4 pools) small enough
  that prompts of a few dozen tokens exercise real sparse selection.
- ``small``: a trained-size model (about 6.6M parameters, 8 layers: KDA:DSA 3:1, one dense layer
  then 16-expert MoE, 4 mHC streams, the MTP layer) over a 4096-token BPE vocabulary whose special
  tokens come first; ``glmlab train`` trains it on the Python standard library
  (data/checkpoints/small holds the result).
- ``slice(n)``: real widths, the first ``n`` layers (same 3:1 KDA:DSA pattern and dense/MoE
  split).

``data/configs/<name>/config.json`` are these dicts written to disk (a test keeps them equal).
"""

from __future__ import annotations

import copy
from typing import Any

from glmlab.checkpoint.tokenizer import SPECIAL_TOKENS, TINY_SPECIALS
from glmlab.config import ModelConfig

# The published multimodal checkpoint nests the text tower; the vision tower is ignored by glmlab.
_FULL_TEXT: dict[str, Any] = {
    "model_type": "glm5_next_text",
    "vocab_size": 154880,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 45,
    "num_nextn_predict_layers": 1,
    "layer_types": [
        "deepseek_sparse_attention" if i % 4 == 3 else "linear_attention" for i in range(45)
    ],
    "mlp_layer_types": ["dense"] * 3 + ["sparse"] * 42,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "indexer_types": ["full"] * 45,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "swiglu_limit": 10.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 1048576,
    "linear_attn_config": {
        "num_heads": 64,
        "head_dim": 128,
        "short_conv_kernel_size": 4,
        "gate_lower_bound": -5.0,
    },
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 256,
    "qk_rope_head_dim": 0,
    "v_head_dim": 256,
    "attention_bias": False,
    "mla_use_nope": True,
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 2048,
    "index_kpool": 4,
    "index_kpool_compress": True,
    "index_kpool_always_select_tail": True,
    "n_routed_experts": 288,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "moe_router_dtype": "float32",
    "mhc": True,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    # <|endoftext|>, <|user|>, <|observation|>: GLM-4.5's ids shifted by the same +3491 that maps
    # its image token (151363) to GLM-5.3's (154854); pad is <|endoftext|>.
    "pad_token_id": 154820,
    "eos_token_id": [154820, 154827, 154829],
    "dtype": "bfloat16",
}

_FULL_VISION: dict[str, Any] = {
    "model_type": "glm5_next_vision",
    "depth": 24,
    "hidden_size": 1024,
    "num_heads": 16,
    "intermediate_size": 4096,
    "out_hidden_size": 1536,
    "projection_intermediate_size": 10240,
}

# HF builds its vision tower from vision_config even for text-only use, so small presets carry
# a minimal one (a missing vision_config would build the 460M-parameter default).
_TINY_VISION: dict[str, Any] = {
    "model_type": "glm5_next_vision",
    "depth": 1,
    "hidden_size": 32,
    "num_heads": 2,
    "intermediate_size": 32,
    "out_hidden_size": 64,
    "projection_intermediate_size": 64,
}

_FP8 = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}

TINY_VOCAB = 320  # 256 byte tokens + the specials, rounded up


def _wrap(text: dict[str, Any], vision: dict[str, Any], fp8: bool) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": ["Glm5NextForConditionalGeneration"],
        "model_type": "glm5_next",
        "text_config": text,
        "vision_config": vision,
        "tie_word_embeddings": False,
    }
    if fp8:
        cfg["quantization_config"] = dict(_FP8)
    return cfg


def full() -> dict[str, Any]:
    return _wrap(copy.deepcopy(_FULL_TEXT), dict(_FULL_VISION), fp8=True)


def slice_(n_layers: int, fp8: bool = True) -> dict[str, Any]:
    """Real widths, the first ``n_layers`` layers of the full schedule, plus the MTP layer."""
    if not 1 <= n_layers <= 45:
        raise ValueError(f"slice needs 1..45 layers, got {n_layers}")
    text = copy.deepcopy(_FULL_TEXT)
    text["num_hidden_layers"] = n_layers
    for key in ("layer_types", "mlp_layer_types", "indexer_types"):
        text[key] = text[key][:n_layers]
    return _wrap(text, dict(_TINY_VISION), fp8=fp8)


def tiny(fp8: bool = False) -> dict[str, Any]:
    text = copy.deepcopy(_FULL_TEXT)
    text.update(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["deepseek_sparse_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        first_k_dense_replace=1,
        indexer_types=["full"] * 4,
        linear_attn_config={
            "num_heads": 2,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0,
        },
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        v_head_dim=16,
        # Eight indexer heads make an all-ReLU-zero score tie rare (docs/model.md section 5).
        index_n_heads=8,
        index_head_dim=16,
        index_topk=16,
        index_kpool=4,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        max_position_embeddings=4096,
        pad_token_id=TINY_SPECIALS["<|endoftext|>"],
        eos_token_id=[TINY_SPECIALS[t] for t in ("<|endoftext|>", "<|user|>", "<|observation|>")],
    )
    return _wrap(text, dict(_TINY_VISION), fp8=fp8)


SMALL_VOCAB = 4096
SMALL_SPECIALS = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}  # a trained BPE lists them first


def small(fp8: bool = False) -> dict[str, Any]:
    text = copy.deepcopy(_FULL_TEXT)
    text.update(
        vocab_size=SMALL_VOCAB,
        hidden_size=192,
        intermediate_size=576,
        moe_intermediate_size=32,
        num_hidden_layers=8,
        layer_types=["deepseek_sparse_attention" if i % 4 == 3 else "linear_attention"
                     for i in range(8)],
        mlp_layer_types=["dense"] + ["sparse"] * 7,
        first_k_dense_replace=1,
        indexer_types=["full"] * 8,
        linear_attn_config={
            "num_heads": 3,
            "head_dim": 64,
            "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0,
        },
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=128,
        kv_lora_rank=128,  # a multiple of 128: the FP8 latent layout keeps one scale per 128
        qk_nope_head_dim=48,
        v_head_dim=48,
        index_n_heads=8,
        index_head_dim=32,
        index_topk=128,  # 32 pools: a quarter of the 512-token training context
        index_kpool=4,
        n_routed_experts=16,
        num_experts_per_tok=2,
        n_shared_experts=1,
        max_position_embeddings=4096,
        pad_token_id=SMALL_SPECIALS["<|endoftext|>"],
        eos_token_id=[SMALL_SPECIALS[t] for t in ("<|endoftext|>", "<|user|>", "<|observation|>")],
    )
    return _wrap(text, dict(_TINY_VISION), fp8=fp8)


PRESETS = {"tiny": tiny, "small": small, "full": full}


def preset(name: str) -> dict[str, Any]:
    """``tiny``, ``small``, ``full`` or ``slice:N`` as a config.json dict."""
    if name.startswith("slice"):
        _, _, n = name.partition(":")
        return slice_(int(n or 4))
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose tiny, small, full or slice:N")
    return PRESETS[name]()


def preset_config(name: str) -> ModelConfig:
    return ModelConfig.from_hf(preset(name))
