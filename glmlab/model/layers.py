"""Blocks shared by every layer family: RMSNorm and a linear layer that may hold FP8 weights.

Numerics follow transformers' GLM-5.3-Flash: RMSNorm normalises in fp32 and casts back to the input
dtype *before* the weight multiply; block-FP8 weights are either dequantised once at load (the
reference path) or kept as E4M3 + ``weight_scale_inv`` and dequantised on the fly (what a fast
block-FP8 GEMM consumes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmlab.kernels.fp8.ref import FP8, dequant_block_fp8


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Unweighted RMSNorm in fp32 (the mHC input norm)."""
    xf = x.float()
    return xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)


class Linear(nn.Module):
    """y = x W^T with W [out, in]; W is a plain tensor or block-FP8 with ``weight_scale_inv``."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.register_buffer("weight_scale_inv", None, persistent=False)
        self.block = (128, 128)

    @property
    def is_fp8(self) -> bool:
        return self.weight.dtype == FP8

    def set_fp8(self, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> None:
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale_inv = scale.float()
        self.block = block

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        if self.is_fp8:
            return dequant_block_fp8(self.weight, self.weight_scale_inv, dtype, self.block)
        return self.weight if self.weight.dtype == dtype else self.weight.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dense_weight(x.dtype))

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, {self.weight.dtype}"
