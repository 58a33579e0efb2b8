"""Dense SwiGLU MLP with GLM's clamps: down(silu(min(gate, L)) * clamp(up, -L, L)), L = 10.

Used by the first dense layers and as the MoE's shared expert.
"""

from __future__ import annotations

import torch
from torch import nn

from glmlab.kernels.moe.ref import clamped_swiglu
from glmlab.model.layers import Linear


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, limit: float):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size)
        self.up_proj = Linear(hidden_size, intermediate_size)
        self.down_proj = Linear(intermediate_size, hidden_size)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(clamped_swiglu(self.gate_proj(x), self.up_proj(x), self.limit))
