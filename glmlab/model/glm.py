"""The GLM-5.3-Flash text model: embedding -> 4 mHC streams -> layers -> stream mean -> norm.

Each decoder layer (docs/model.md section 2.3) runs two mHC sites:
  pre, post, comb = mHC_attn(X);  y = Attn(RMSNorm_in(sum_i pre_i X_i));   X = post (x) y + comb^T X
  pre, post, comb = mHC_ffn(X);   y = FFN(RMSNorm_post(sum_i pre_i X_i));  X = post (x) y + comb^T X
Attn is KDA or DSA and FFN dense or MoE, per ``ModelConfig.layer_types`` / ``ffn_types``. A site's
write-back is carried to the next site as ``pending`` and applied together with its coefficients
(one kernel on the fused backends; the same reference ops in the same order on torch).

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
from glmlab.model.mhc import HyperConnection, Pending
from glmlab.model.mlp import MLP
from glmlab.model.moe import Experts, MoE, Router
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
        x, pending = self.forward_pending(x, None, plan, cache)
        return self.hc_ffn.write_back(x, pending)

    def forward_pending(self, x: torch.Tensor, pending: Pending | None, plan: ForwardPlan,
                        cache: ModelCache) -> tuple[torch.Tensor, Pending]:
        """The layer on streams x whose previous site's write-back is still ``pending``; returns
        the streams before this layer's FFN write-back and that write-back (for the next layer's
        first site, which applies it together with its own coefficients)."""
        x, pre, post, comb = self.hc_attn.mix(x, pending)
        y = self.self_attn(self.hc_attn.collapse_norm(x, pre, self.input_layernorm), plan, cache)
        x, pre, post_f, comb_f = self.hc_ffn.mix(x, (y, post, comb))
        y = self.mlp(self.hc_ffn.collapse_norm(x, pre, self.post_attention_layernorm))
        return x, (y, post_f, comb_f)


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
        """Bind every layer to the named implementations (resolved once, here). Fast backends
        also fuse projections that share an input into one GEMM (the parts become views of the
        merged weight, so the reference path still computes exactly what it did)."""
        ops = backends.resolve()
        fuse = backends.linear_fp8 == "triton" or backends.kda_step == "triton" \
            or backends.dsa_index == "triton"
        for m in self.modules():
            if isinstance(m, Linear):
                m.fp8_op = ops["linear_fp8"]
            elif isinstance(m, RMSNorm):
                m.op = ops["rmsnorm"]
            elif isinstance(m, HyperConnection):
                m.ops = ops["mhc"]
            elif isinstance(m, Router):
                m.op = ops["router"]
            elif isinstance(m, KDAttention):
                m.prefill_op, m.decode_op = ops["kda_prefill"], ops["kda_decode"]
                m.step = ops["kda_step"]
            elif isinstance(m, DSAttention):
                m.attend, m.index = ops["sparse_mla"], ops["dsa_index"]
            elif isinstance(m, Experts):
                m.op = ops["moe_experts"]
        for m in list(self.modules()):  # after binding: merged Linears take the parts' ops
            if isinstance(m, (KDAttention, DSAttention, MLP)) and fuse:
                m.fuse_projections()
            elif isinstance(m, (KDAttention, DSAttention, MLP)):
                m.unfuse_projections()
            if isinstance(m, (KDAttention, DSAttention)):
                m.prepare_step(fast=backends.kda_step == "triton" if isinstance(m, KDAttention)
                               else backends.dsa_index == "triton")
            if isinstance(m, MLP):
                m.fast_act = backends.linear_fp8 == "triton"
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
        captured, pending = [], None
        for i, layer in enumerate(self.layers):
            x, pending = layer.forward_pending(x, pending, plan, cache)
            if i in capture_layers:
                captured.append(layer.hc_ffn.write_back(x, pending).mean(dim=1))
        x = self.layers[-1].hc_ffn.write_back(x, pending)
        return self.norm(x.mean(dim=1)), captured

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [..., V] of hidden [..., D]. The rows go in as one 2-D matrix: a strided
        3-D input (the DFlash2 draft's ``hidden[:, 1:]``) makes torch's matmul broadcast the
        weight into a batched GEMM that reads the whole lm_head once per batch row (H200: 38 ms
        for 132 x 7 rows, against ~0.4 ms as one GEMM)."""
        out = self.lm_head(hidden.reshape(-1, hidden.shape[-1])).float()
        return out.view(*hidden.shape[:-1], out.shape[-1])  # also for zero rows

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
