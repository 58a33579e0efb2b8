"""Torch references for the GLM-5.3-Flash MoE: routing and the per-expert clamped-SwiGLU loop.

Shapes (kernels/README.md): T tokens, D hidden, I expert intermediate, E experts, A active experts
per token.

Routing (docs/model.md section 2.6): fp32 sigmoid scores; the correction bias steers *selection
only*; the chosen scores are renormalised and multiplied by the routed scaling factor (2.5).
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
        Pairs whose id is outside [0, E) (another EP rank's expert) contribute nothing.
    """
    out = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        if not 0 <= e < w13.shape[0]:
            continue
        tok, slot = torch.where(ids == e)
        fp8 = w13_scale is not None
        up_w = dequant_block_fp8(w13[e], w13_scale[e], x.dtype, block) if fp8 else w13[e]
        down_w = dequant_block_fp8(w2[e], w2_scale[e], x.dtype, block) if fp8 else w2[e]
        gate, up = F.linear(x[tok], up_w.to(x.dtype)).chunk(2, dim=-1)
        y = F.linear(clamped_swiglu(gate, up, limit), down_w.to(x.dtype)) * weights[tok, slot, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


# ---- block-FP8 (W8A8) recipe and the grouped-GEMM bookkeeping, specified for the Triton path ----

def moe_align_ref(ids: torch.Tensor, num_experts: int, block_m: int
                  ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Sort (token, slot) pairs by expert and pad each expert's run to a multiple of ``block_m``.

    Args:
        ids: [T, A] expert ids; ids outside [0, E) (e.g. -1: another EP rank's expert) are
        skipped.
    Returns:
        sorted_ids [num_padded] pair indices ``t * A + a`` in expert order (token order inside an
        expert), pad slots hold ``T * A``; expert_ids [num_padded / block_m], one per row block;
        num_padded.
    """
    flat = ids.reshape(-1)
    sentinel = flat.numel()
    runs, experts = [], []
    for e in range(num_experts):
        pairs = torch.nonzero(flat == e).flatten()
        if pairs.numel() == 0:
            continue
        pad = -pairs.numel() % block_m
        runs.append(torch.cat([pairs, pairs.new_full((pad,), sentinel)]))
        experts += [e] * ((pairs.numel() + pad) // block_m)
    sorted_ids = torch.cat(runs) if runs else flat.new_zeros(0)
    return sorted_ids, torch.tensor(experts, dtype=torch.long), sorted_ids.numel()


def swiglu_quant_ref(h: torch.Tensor, limit: float, group: int = 128
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused path between the two GEMMs: clamped SwiGLU in ``h.dtype``, then FP8 quantisation.

    Args:
        h: [R, 2I] gate_up output (gate columns, then up columns) in the activation dtype (bf16).
    Returns:
        fp8 [R, I] and fp32 scales [R, ceil(I / group)]. The activation is rounded to ``h.dtype``
        before its absmax is taken; the fused kernel must reproduce exactly this.
    """
    from glmlab.kernels.fp8.ref import quant_act_fp8

    gate, up = h.chunk(2, dim=-1)
    return quant_act_fp8(clamped_swiglu(gate, up, limit), group)


def moe_experts_fp8_ref(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                        w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                        w2_scale: torch.Tensor, limit: float, block: tuple[int, int] = (128, 128)
                        ) -> torch.Tensor:
    """Routed experts under the block-FP8 W8A8 recipe (what the Triton grouped GEMMs compute).

    x is quantised per token per ``block[1]`` channels; each GEMM is an fp32 product of the
    dequantised operands, its output rounded to ``x.dtype`` (as the kernel stores it); the clamped
    SwiGLU runs in ``x.dtype`` and is requantised like ``swiglu_quant_ref``; each (token, slot)
    output is scaled by its routing weight and rounded to ``x.dtype``; the slots of a token are
    summed in fp32 in slot order. Pairs whose id is outside [0, E) contribute nothing.

    Args:
        x: [T, D].  ids, weights: [T, A].  w13: [E, 2I, D] E4M3, w13_scale [E, 2I/128, D/128];
        w2: [E, D, I] E4M3, w2_scale [E, D/128, I/128].
    Returns:
        [T, D] in x.dtype.
    """
    from glmlab.kernels.fp8.ref import quant_act_fp8

    t, a = ids.shape
    xq, xs = quant_act_fp8(x, block[1])
    x_deq = dequant_block_fp8(xq, xs, torch.float32, (1, block[1]))
    pair_out = torch.zeros(t, a, x.shape[1], dtype=x.dtype, device=x.device)
    for e in torch.unique(ids).tolist():
        if not 0 <= e < w13.shape[0]:
            continue
        tok, slot = torch.where(ids == e)
        h = (x_deq[tok] @ dequant_block_fp8(w13[e], w13_scale[e], torch.float32, block).t())
        hq, hs = swiglu_quant_ref(h.to(x.dtype), limit, block[1])
        h_deq = dequant_block_fp8(hq, hs, torch.float32, (1, block[1]))
        y = h_deq @ dequant_block_fp8(w2[e], w2_scale[e], torch.float32, block).t()
        pair_out[tok, slot] = (y * weights[tok, slot, None].float()).to(x.dtype)
    return pair_out.float().sum(dim=1).to(x.dtype)
