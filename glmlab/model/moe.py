"""Mixture of experts: a sigmoid router over E routed experts (top-A) plus one shared expert.

Router (fp32): s = sigmoid(W_r h); experts chosen by s + e_score_correction_bias (the bias steers
selection only); weights = s_chosen / sum(s_chosen) * routed_scaling (``kernels/fused/ref.py``
``router_ref``, or the one-kernel router on the triton backend). Experts are clamped-SwiGLU
MLPs stored stacked: ``w13`` [E, 2I, D] (gate rows, then up rows) and ``w2`` [E, D, I], the layout a
grouped GEMM reads. FP8 checkpoints keep the stacks as E4M3 with per-block scales.
"""

from __future__ import annotations

import torch
from torch import nn

from glmlab.config import ModelConfig
from glmlab.kernels.fp8.ref import FP8
from glmlab.model import torch_ops
from glmlab.model.mlp import MLP


class Router(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.moe.num_experts, cfg.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.moe.num_experts))
        self.top_k, self.scaling = cfg.moe.top_k, cfg.moe.routed_scaling
        self.renormalize = cfg.moe.norm_topk_prob
        self.op = torch_ops.router

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [T, D] -> weights [T, A] fp32, ids [T, A] (the ``router`` backend op)."""
        return self.op(h, self)


class Experts(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m, d = cfg.moe, cfg.hidden_size
        self.w13 = nn.Parameter(torch.empty(m.num_experts, 2 * m.intermediate_size, d),
                                requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(m.num_experts, d, m.intermediate_size),
                               requires_grad=False)
        self.register_buffer("w13_scale", None, persistent=False)
        self.register_buffer("w2_scale", None, persistent=False)
        self.block = (128, 128)
        self.limit = cfg.swiglu_limit
        self.op = torch_ops.moe_experts

    @property
    def is_fp8(self) -> bool:
        return self.w13.dtype == FP8

    def set_fp8(self, w13, w13_scale, w2, w2_scale, block: tuple[int, int]) -> None:
        self.w13 = nn.Parameter(w13, requires_grad=False)
        self.w2 = nn.Parameter(w2, requires_grad=False)
        self.w13_scale, self.w2_scale = w13_scale.float(), w2_scale.float()
        self.block = block

    def forward(self, x, ids, weights):
        return self.op(x, ids, weights, self)


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = Router(cfg)
        self.experts = Experts(cfg)
        self.shared_experts = MLP(cfg.hidden_size, cfg.moe.intermediate_size * cfg.moe.num_shared,
                                  cfg.swiglu_limit)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(h)
        # routed + shared: the add is the shared expert's down-projection epilogue
        return self.shared_experts(h, residual=self.experts(h, ids, weights))
