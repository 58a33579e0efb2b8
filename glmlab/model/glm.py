"""The GLM-5.3-Flash text model: embedding -> 4 mHC streams -> layers -> stream mean -> norm.

Each decoder layer (docs/model.md section 2.3) runs two mHC sites:
  pre, post, comb = mHC_attn(X);  y = Attn(RMSNorm_in(sum_i pre_i X_i));   X = post (x) y + comb^T X
  pre, post, comb = mHC_ffn(X);   y = FFN(RMSNorm_post(sum_i pre_i X_i));  X = post (x) y + comb^T X
Attn is KDA or DSA and FFN dense or MoE, per ``ModelConfig.layer_types`` / ``ffn_types``.

The model reads a flat token batch and a ``ForwardPlan``; all carried state lives in a
``ModelCache``. It returns the final normalised hidden states; ``logits`` applies the untied
lm_head.
It knows nothing about scheduling, sampling or where weights come from.
"""

from __future__ import annotations

import torch
from torch import nn

from glmlab.cache.storage import ModelCache
from glmlab.config import FfnType, LayerType, ModelConfig
from glmlab.model.backends import Backends
from glmlab.model.dsa import DSAttention
from glmlab.model.kda import KDAttention
from glmlab.model.layers import Linear, RMSNorm
from glmlab.model.mhc import HyperConnection
from glmlab.model.mlp import MLP
from glmlab.model.moe import Experts, MoE
from glmlab.model.mtp import MTPLayer
from glmlab.model.plan import ForwardPlan

# Parameters kept in fp32 whatever the model dtype (transformers keeps the same set in fp32).
FP32_PARAMS = (
    "A_log",
    "dt_bias",
    "_conv1d",
    "hc_attn.base",
    "hc_attn.scale",
    "hc_ffn.base",
    "hc_ffn.scale",
    "e_score_correction_bias",
)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        kda = cfg.layer_types[layer_idx] is LayerType.KDA
        self.self_attn = KDAttention(cfg, layer_idx) if kda else DSAttention(cfg, layer_idx)
        dense = cfg.ffn_types[layer_idx] is FfnType.DENSE
        self.mlp = (
            MLP(cfg.hidden_size, cfg.intermediate_size, cfg.swiglu_limit) if dense else MoE(cfg)
        )
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hc_attn = HyperConnection(cfg.mhc, cfg.hidden_size, cfg.rms_norm_eps)
        self.hc_ffn = HyperConnection(cfg.mhc, cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, plan: ForwardPlan, cache: ModelCache) -> torch.Tensor:
        """x: [T, N, D] streams -> [T, N, D]."""
        pre, post, comb = self.hc_attn.coefficients(x)
        y = self.self_attn(self.input_layernorm(self.hc_attn.collapse(x, pre)), plan, cache)
        x = self.hc_attn.expand(x, y, post, comb)
        pre, post, comb = self.hc_ffn.coefficients(x)
        y = self.mlp(self.post_attention_layernorm(self.hc_ffn.collapse(x, pre)))
        return self.hc_ffn.expand(x, y, post, comb)


class GLM5Model(nn.Module):
    def __init__(self, cfg: ModelConfig, with_mtp: bool = True):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        self.mtp = MTPLayer(cfg) if with_mtp and cfg.mtp_layer is not None else None
        self.backends = Backends()

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def to_dtype(self, dtype: torch.dtype) -> GLM5Model:
        """Cast floating weights to ``dtype`` except FP8 weights and the fp32-kept parameters."""
        for name, p in self.named_parameters():
            if not p.is_floating_point() or p.dtype == torch.float8_e4m3fn:
                continue
            want = torch.float32 if any(k in name for k in FP32_PARAMS) else dtype
            p.data = p.data.to(want)
        return self

    def use_backends(self, backends: Backends) -> GLM5Model:
        """Bind every layer to the named implementations (resolved once, here)."""
        ops = backends.resolve()
        for m in self.modules():
            if isinstance(m, KDAttention):
                m.prefill_op, m.decode_op = ops["kda_prefill"], ops["kda_decode"]
            elif isinstance(m, DSAttention):
                m.attend = ops["sparse_mla"]
            elif isinstance(m, Experts):
                m.op = ops["moe_experts"]
        self.backends = backends
        return self

    def forward(
        self,
        input_ids: torch.Tensor,
        plan: ForwardPlan,
        cache: ModelCache,
        capture_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """input_ids [T] -> (final normalised hidden [T, D], stream means after capture_layers)."""
        x = self.embed_tokens(input_ids)
        x = x[:, None, :].expand(-1, self.cfg.mhc.num_streams, -1).contiguous()
        captured = []
        for i, layer in enumerate(self.layers):
            x = layer(x, plan, cache)
            if i in capture_layers:
                captured.append(x.mean(dim=1))
        return self.norm(x.mean(dim=1)), captured

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def mtp_forward(
        self,
        target_hidden: torch.Tensor,
        next_ids: torch.Tensor,
        plan: ForwardPlan,
        cache: ModelCache,
    ) -> torch.Tensor:
        """MTP hidden [T, D] from the target's final hidden at t and the token at t+1."""
        if self.mtp is None:
            raise RuntimeError("this model was built without its MTP layer")
        return self.mtp(target_hidden, self.embed_tokens(next_ids), plan, cache)
