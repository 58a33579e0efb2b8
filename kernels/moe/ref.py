"""Torch references for the GLM-5.3-Flash MoE: routing and the per-expert clamped-SwiGLU loop.

Shapes (kernels/README.md): T tokens, D hidden, I expert intermediate, E experts, A active per token.

Routing (MODEL.md section 2.6): fp32 sigmoid scores; the correction bias steers *selection only*;
the chosen scores are renormalised and multiplied by the routed scaling factor (2.5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glmlab.kernels.fp8.ref import dequant_block_fp8


def route_ref(logits: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float,
              renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts per token.

    Args:
        logits: [T, E] router logits (fp32).  bias: [E] e_score_correction_bias (fp32).
    Returns:
        weights [T, A] fp32 and expert ids [T, A] int64.
    """
    scores = logits.float().sigmoid()
    ids = torch.topk(scores + bias.float(), k=top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, ids


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit): gate is clamped above only."""
    return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


def moe_experts_ref(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                    w13: torch.Tensor, w2: torch.Tensor, limit: float,
                    w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                    block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """Weighted sum of the chosen experts' outputs (no shared expert).

    Args:
        x: [T, D].  ids, weights: [T, A].
        w13: [E, 2I, D] gate rows then up rows.  w2: [E, D, I].  In x.dtype, or FP8 E4M3 with
        block scales ``w13_scale`` [E, 2I/128, D/128] and ``w2_scale`` [E, D/128, I/128]; an
        expert's FP8 weights are dequantised only when a token routes to it.
    Returns:
        [T, D] in x.dtype. Experts are visited in ascending id and their weighted outputs are
        accumulated in x.dtype, the order transformers uses, so bf16 results match it closely.
    """
    out = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        up_w = w13[e] if w13_scale is None else dequant_block_fp8(w13[e], w13_scale[e], x.dtype, block)
        down_w = w2[e] if w2_scale is None else dequant_block_fp8(w2[e], w2_scale[e], x.dtype, block)
        gate, up = F.linear(x[tok], up_w.to(x.dtype)).chunk(2, dim=-1)
        y = F.linear(clamped_swiglu(gate, up, limit), down_w.to(x.dtype)) * weights[tok, slot, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out
