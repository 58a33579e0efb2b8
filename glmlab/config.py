"""Model configuration: the only reader of a GLM-5.3-Flash ``config.json``.

``ModelConfig.from_hf`` accepts the published layout (a multimodal config with a nested
``text_config``), a flat text-only config, or a config written by transformers'
``save_pretrained``; it maps Hugging Face field names to glmlab names, resolves the per-layer
schedules and checks every invariant the model code relies on. The result is frozen: runtime
discoveries (pool sizes, slots) are returned by whoever computes them, never written back here.

What this module deliberately does not know: weights, devices, dtypes of caches, or anything
about serving. Those belong to ``glmlab.checkpoint`` and ``EngineConfig``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A config.json that glmlab cannot run faithfully."""


class LayerType(str, Enum):
    KDA = "kda"  # Kimi delta attention (HF "linear_attention")
    DSA = "dsa"  # MLA with the k-pool sparse indexer (HF "indexed_attention")


class FfnType(str, Enum):
    DENSE = "dense"
    MOE = "moe"


_HF_LAYER_TYPES = {
    "linear_attention": LayerType.KDA,
    "deepseek_sparse_attention": LayerType.DSA,
    "indexed_attention": LayerType.DSA,
    "full_attention": LayerType.DSA,  # HF remaps this to indexed_attention
}
_HF_FFN_TYPES = {"dense": FfnType.DENSE, "sparse": FfnType.MOE}


@dataclass(frozen=True)
class KDAConfig:
    num_heads: int
    head_dim: int  # dk = dv
    conv_kernel: int
    lower_bound: float  # g = lower_bound * sigmoid(exp(A_log) * f)

    @property
    def proj_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        return 3 * self.proj_dim


@dataclass(frozen=True)
class DSAConfig:
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    v_head_dim: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int  # tokens; index_topk // index_kpool pools are kept
    index_kpool: int
    always_select_tail: bool

    @property
    def topk_pools(self) -> int:
        return self.index_topk // self.index_kpool

    @property
    def max_selected(self) -> int:
        """Width of an index list: the selected pools' tokens plus the incomplete tail."""
        tail = self.index_kpool - 1 if self.always_select_tail else 0
        return self.index_topk + tail

    @property
    def softmax_scale(self) -> float:
        return self.qk_nope_head_dim**-0.5


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    num_shared: int
    intermediate_size: int
    routed_scaling: float
    norm_topk_prob: bool = True


@dataclass(frozen=True)
class MHCConfig:
    num_streams: int  # hc_mult
    sinkhorn_iters: int
    eps: float

    @property
    def proj_dim(self) -> int:
        """Rows of ``fn``: pre (N) + post (N) + comb (N*N)."""
        return (2 + self.num_streams) * self.num_streams


@dataclass(frozen=True)
class FP8Config:
    """Block-FP8 weights as published: E4M3 values, one fp32 multiplier per block."""

    block: tuple[int, int] = (128, 128)
    fmt: str = "e4m3"
    activation_scheme: str = "dynamic"


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # dense MLP
    layer_types: tuple[LayerType, ...]
    ffn_types: tuple[FfnType, ...]
    kda: KDAConfig
    dsa: DSAConfig
    moe: MoEConfig
    mhc: MHCConfig
    rms_norm_eps: float = 1e-5
    swiglu_limit: float = 10.0
    num_mtp_layers: int = 1
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 1_048_576
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    fp8: FP8Config | None = None
    # The raw dict this config was read from; kept so a checkpoint writer can round-trip it.
    source: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.layer_types)
        if n == 0:
            raise ConfigError("num_hidden_layers must be at least 1")
        if len(self.ffn_types) != n:
            raise ConfigError(f"mlp_layer_types has {len(self.ffn_types)} entries for {n} layers")
        d = self.dsa
        if d.index_topk % d.index_kpool:
            raise ConfigError(
                f"index_topk ({d.index_topk}) must be divisible by index_kpool ({d.index_kpool})"
            )
        if self.moe.top_k > self.moe.num_experts:
            raise ConfigError(
                f"num_experts_per_tok ({self.moe.top_k}) exceeds n_routed_experts "
                f"({self.moe.num_experts})"
            )
        if self.mhc.num_streams < 1 or self.mhc.sinkhorn_iters < 1:
            raise ConfigError("hc_mult and hc_sinkhorn_iters must be positive")
        if self.kda.conv_kernel < 1:
            raise ConfigError("linear_conv_kernel_dim must be positive")
        if self.num_mtp_layers not in (0, 1):
            raise ConfigError(f"num_nextn_predict_layers={self.num_mtp_layers}: glmlab runs 0 or 1")

    # ------------------------------------------------------------------ derived views
    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def kda_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t is LayerType.KDA)

    @property
    def dsa_layers(self) -> tuple[int, ...]:
        """Main-model DSA layers; the MTP layer (index num_layers) is not included."""
        return tuple(i for i, t in enumerate(self.layer_types) if t is LayerType.DSA)

    @property
    def mtp_layer(self) -> int | None:
        return self.num_layers if self.num_mtp_layers else None

    def with_layers(self, n_layers: int) -> ModelConfig:
        """The first ``n_layers`` of this model (same widths, same schedules)."""
        if not 1 <= n_layers <= self.num_layers:
            raise ConfigError(f"cannot slice {n_layers} layers out of {self.num_layers}")
        return replace(
            self,
            layer_types=self.layer_types[:n_layers],
            ffn_types=self.ffn_types[:n_layers],
        )

    # ------------------------------------------------------------------ reading
    @classmethod
    def from_hf(cls, src: str | Path | dict[str, Any]) -> ModelConfig:
        """Read a GLM-5.3-Flash config: a checkpoint directory, a config.json path or a dict."""
        raw = _read_raw(src)
        text = dict(raw.get("text_config") or raw)
        # Fields the published config keeps at the top level of a multimodal config.
        for key in ("quantization_config", "eos_token_id", "pad_token_id", "bos_token_id"):
            if key not in text and key in raw:
                text[key] = raw[key]
        return _parse_text_config(text, raw)


def _read_raw(src: str | Path | dict[str, Any]) -> dict[str, Any]:
    if isinstance(src, dict):
        return src
    path = Path(src)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"no config.json at {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from e


def _get(text: dict, key: str, default: Any = ...) -> Any:
    if key in text and text[key] is not None:
        return text[key]
    if default is ...:
        raise ConfigError(f"config.json lacks required field '{key}'")
    return default


def _layer_schedule(text: dict, n: int) -> tuple[LayerType, ...]:
    names = text.get("layer_types")
    if names is None:
        return tuple(LayerType.DSA if i % 4 == 3 else LayerType.KDA for i in range(n))
    if len(names) != n:
        raise ConfigError(f"layer_types has {len(names)} entries for num_hidden_layers={n}")
    try:
        return tuple(_HF_LAYER_TYPES[t] for t in names)
    except KeyError as e:
        raise ConfigError(
            f"unsupported layer type {e.args[0]!r}; expected one of {sorted(_HF_LAYER_TYPES)}"
        ) from None


def _ffn_schedule(text: dict, n: int) -> tuple[FfnType, ...]:
    names = text.get("mlp_layer_types")
    if names is None:
        first_dense = int(text.get("first_k_dense_replace", 3))
        freq = int(text.get("moe_layer_freq", 1))
        return tuple(
            FfnType.MOE if i >= first_dense and (i - first_dense) % freq == 0 else FfnType.DENSE
            for i in range(n)
        )
    if len(names) != n:
        raise ConfigError(f"mlp_layer_types has {len(names)} entries for num_hidden_layers={n}")
    try:
        return tuple(_HF_FFN_TYPES[t] for t in names)
    except KeyError as e:
        raise ConfigError(f"unsupported mlp layer type {e.args[0]!r}") from None


def _kda_config(text: dict) -> KDAConfig:
    nested = text.get("linear_attn_config") or {}
    lower = nested.get("gate_lower_bound", text.get("linear_lower_bound", -5.0))
    if lower is None:
        raise ConfigError("KDA without a gate lower bound (softplus gate) is not supported")
    return KDAConfig(
        num_heads=int(nested.get("num_heads", text.get("linear_num_heads", 64))),
        head_dim=int(nested.get("head_dim", text.get("linear_head_dim", 128))),
        conv_kernel=int(
            nested.get("short_conv_kernel_size", text.get("linear_conv_kernel_dim", 4))),
        lower_bound=float(lower),
    )


def _dsa_config(text: dict) -> DSAConfig:
    if int(text.get("qk_rope_head_dim", 0)) != 0:
        raise ConfigError("GLM-5.3-Flash attention has no RoPE: qk_rope_head_dim must be 0")
    heads = int(_get(text, "num_attention_heads"))
    kv_heads = int(text.get("num_key_value_heads") or heads)
    if kv_heads != heads:
        raise ConfigError(
            f"num_key_value_heads ({kv_heads}) must equal num_attention_heads ({heads})")
    if text.get("q_lora_rank") is None:
        raise ConfigError("DSA attention requires q_lora_rank")
    if text.get("attention_bias"):
        raise ConfigError("attention_bias=true is not part of GLM-5.3-Flash")
    kinds = set(text.get("indexer_types") or ["full"])
    if kinds != {"full"}:
        raise ConfigError(
            f"indexer_types {sorted(kinds)}: only 'full' is supported (shared top-k cannot cross "
            "the KDA layers between DSA layers; the release uses 'full' everywhere)"
        )
    if text.get("index_kpool_compress", True) is False:
        raise ConfigError("index_kpool_compress=false is not supported")
    return DSAConfig(
        num_heads=heads,
        q_lora_rank=int(text["q_lora_rank"]),
        kv_lora_rank=int(_get(text, "kv_lora_rank")),
        qk_nope_head_dim=int(_get(text, "qk_nope_head_dim")),
        v_head_dim=int(_get(text, "v_head_dim")),
        index_n_heads=int(text.get("index_n_heads", 32)),
        index_head_dim=int(text.get("index_head_dim", 128)),
        index_topk=int(text.get("index_topk", 2048)),
        index_kpool=int(text.get("index_kpool", 16)),
        always_select_tail=bool(text.get("index_kpool_always_select_tail", True)),
    )


def _moe_config(text: dict) -> MoEConfig:
    scoring = text.get("scoring_func", "sigmoid")
    if scoring != "sigmoid":
        raise ConfigError(f"scoring_func={scoring!r}: GLM-5.3-Flash routes with sigmoid")
    method = text.get("topk_method", "noaux_tc")
    if method != "noaux_tc":
        raise ConfigError(f"topk_method={method!r}: only noaux_tc is supported")
    n_group, topk_group = int(text.get("n_group", 1)), int(text.get("topk_group", 1))
    if n_group != topk_group:
        raise ConfigError(
            f"group-limited routing (n_group={n_group}, topk_group={topk_group}) is not supported"
        )
    return MoEConfig(
        num_experts=int(_get(text, "n_routed_experts")),
        top_k=int(_get(text, "num_experts_per_tok")),
        num_shared=int(text.get("n_shared_experts", 1)),
        intermediate_size=int(_get(text, "moe_intermediate_size")),
        routed_scaling=float(text.get("routed_scaling_factor", 1.0)),
        norm_topk_prob=bool(text.get("norm_topk_prob", True)),
    )


def _fp8_config(text: dict) -> FP8Config | None:
    q = text.get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method")
    if method != "fp8":
        raise ConfigError(f"quantization_config.quant_method={method!r}: only 'fp8' is supported")
    fmt = q.get("fmt", "e4m3")
    block = tuple(q.get("weight_block_size") or (128, 128))
    if fmt != "e4m3" or len(block) != 2:
        raise ConfigError(f"unsupported FP8 recipe fmt={fmt!r} weight_block_size={list(block)}")
    return FP8Config(block=(int(block[0]), int(block[1])), fmt=fmt,
                     activation_scheme=q.get("activation_scheme", "dynamic"))


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, list | tuple) else (int(value),)


def _parse_text_config(text: dict, raw: dict) -> ModelConfig:
    if text.get("mhc") is False:
        raise ConfigError("mhc=false: GLM-5.3-Flash checkpoints are trained with mHC streams")
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"hidden_act={act!r}: GLM-5.3-Flash uses SwiGLU (silu)")
    n = int(_get(text, "num_hidden_layers"))
    return ModelConfig(
        vocab_size=int(_get(text, "vocab_size")),
        hidden_size=int(_get(text, "hidden_size")),
        intermediate_size=int(_get(text, "intermediate_size")),
        layer_types=_layer_schedule(text, n),
        ffn_types=_ffn_schedule(text, n),
        kda=_kda_config(text),
        dsa=_dsa_config(text),
        moe=_moe_config(text),
        mhc=MHCConfig(
            num_streams=int(text.get("hc_mult", 4)),
            sinkhorn_iters=int(text.get("hc_sinkhorn_iters", 20)),
            eps=float(text.get("hc_eps", 1e-6)),
        ),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-5)),
        swiglu_limit=float(text.get("swiglu_limit", 10.0)),
        num_mtp_layers=int(text.get("num_nextn_predict_layers", 0)),
        tie_word_embeddings=bool(
            raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        max_position_embeddings=int(text.get("max_position_embeddings", 1_048_576)),
        pad_token_id=text.get("pad_token_id"),
        bos_token_id=text.get("bos_token_id"),
        eos_token_ids=_eos_ids(text.get("eos_token_id")),
        fp8=_fp8_config(text),
        source=raw,
    )
