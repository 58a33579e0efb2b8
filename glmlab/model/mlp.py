"""Dense SwiGLU MLP with GLM's clamps: down(silu(min(gate, L)) * clamp(up, -L, L)), L = 10.

Used by the first dense layers and as the MoE's shared expert. On the fast backends the gate and
up projections run as one GEMM (``fuse_projections``) and the clamped SwiGLU as one kernel that,
for block-FP8 down weights, also quantises the activation for the down GEMM
(``kernels/moe/act_triton.py``, bit-equal to the unfused torch path on a GPU).
"""

from __future__ import annotations

import torch
from torch import nn

from glmlab.kernels.moe.ref import clamped_swiglu
from glmlab.model.layers import Linear, merge_linears


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, limit: float):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size)
        self.up_proj = Linear(hidden_size, intermediate_size)
        self.down_proj = Linear(intermediate_size, hidden_size)
        self.limit = limit
        self.gate_up: Linear | None = None  # set by fuse_projections
        self.fast_act = False

    def fuse_projections(self) -> None:
        """gate and up as one GEMM (not a submodule: its weight is the parts' storage)."""
        if self.gate_up is None:
            self.__dict__["gate_up"] = merge_linears([self.gate_proj, self.up_proj])
        if self.gate_up is not None:
            self.gate_up.fp8_op = self.gate_proj.fp8_op

    def unfuse_projections(self) -> None:
        """Back to one GEMM per part (their weights stay views of the merged storage)."""
        self.__dict__["gate_up"] = None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """down(swiglu(gate(x), up(x))) (+ residual, added after the product is rounded)."""
        if self.gate_up is None or not self.fast_act:
            return self._down(clamped_swiglu(self.gate_proj(x), self.up_proj(x), self.limit),
                              residual)
        from glmlab.kernels.moe.act_triton import swiglu, swiglu_quant

        h = self.gate_up(x)  # [T, 2I]: gate columns, then up columns
        if self.down_proj.is_fp8 and type(self.down_proj) is Linear:
            q, s = swiglu_quant(h, self.limit)
            return self.down_proj(q, residual, x_scale=s)
        return self._down(swiglu(h, self.limit), residual)

    def _down(self, act: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        if type(self.down_proj) is Linear:  # the add fuses into the GEMM epilogue
            return self.down_proj(act, residual)
        y = self.down_proj(act)  # e.g. a row-parallel shard: add after its all-reduce
        return y if residual is None else y + residual
