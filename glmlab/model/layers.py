"""Blocks shared by every layer family: RMSNorm and a linear layer that may hold FP8 weights.

Numerics follow transformers' GLM-5.3-Flash: RMSNorm normalises in fp32 and casts back to the input
dtype *before* the weight multiply; block-FP8 weights are either dequantised once at load (the
reference path) or kept as E4M3 + ``weight_scale_inv`` and consumed by the ``linear_fp8`` backend op
(torch: dequantise on the fly; triton: the block-FP8 GEMM). Both modules run through a backend op
bound by ``GLM5Model.use_backends`` (``glmlab.model.backends``), the torch one by default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmlab.kernels.fp8.ref import FP8, dequant_block_fp8
from glmlab.kernels.fused.ref import rms_normalize
from glmlab.model import torch_ops

__all__ = ["Linear", "RMSNorm", "merge_linears", "rms_normalize"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.op = torch_ops.rmsnorm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, self)[0]

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the pre-norm block's add and the next norm."""
        return self.op(x, self, residual)


class Linear(nn.Module):
    """y = x W^T with W [out, in]; W is a plain tensor or block-FP8 with ``weight_scale_inv``."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.register_buffer("weight_scale_inv", None, persistent=False)
        self.block = (128, 128)
        self.fp8_op = torch_ops.linear_fp8

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

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                x_scale: torch.Tensor | None = None) -> torch.Tensor:
        """x W^T (+ residual, added after the product is rounded). ``x_scale``: x is E4M3 with
        per-token-group scales (FP8 weights on the triton backend only)."""
        if self.is_fp8:
            return self.fp8_op(x, self, residual, x_scale)
        y = F.linear(x, self.dense_weight(x.dtype))
        return y if residual is None else y + residual

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, {self.weight.dtype}"


def merge_linears(parts: list[Linear]) -> Linear | None:
    """One Linear computing ``cat([p(x) for p in parts], -1)``, or None when they cannot merge.

    The parts' weights become views into the merged weight (no second copy stays resident), so
    the parts still compute exactly what they did. FP8 parts merge only when every part's rows
    fill whole scale blocks (their scales then stack too).
    """
    first = parts[0]
    if any(p.in_features != first.in_features or p.weight.dtype != first.weight.dtype
           or p.weight.device != first.weight.device for p in parts):
        return None
    fp8 = first.is_fp8
    if fp8 and any(tuple(p.block) != tuple(first.block) or p.out_features % p.block[0]
                   for p in parts):
        return None
    merged = Linear(first.in_features, sum(p.out_features for p in parts))
    w = torch.cat([p.weight.data for p in parts])
    if fp8:
        merged.set_fp8(w, torch.cat([p.weight_scale_inv for p in parts]), tuple(first.block))
    else:
        merged.weight = nn.Parameter(w, requires_grad=False)
    merged.fp8_op = first.fp8_op
    row = 0
    for p in parts:
        p.weight = nn.Parameter(merged.weight.data[row:row + p.out_features], requires_grad=False)
        if fp8:
            b0 = row // p.block[0]
            p.weight_scale_inv = merged.weight_scale_inv[b0:b0 + p.out_features // p.block[0]]
        row += p.out_features
    return merged
