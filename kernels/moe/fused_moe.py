"""Routed-expert MoE on Triton: align -> quantise x -> gate_up -> SwiGLU+quant -> down -> combine.

``fused_moe`` runs the whole routed part for given top-k ids and weights; ``moe_experts_triton``
is the same thing in the model-backend signature (``glmlab.model.backends``, name ``"triton"``),
reading the layer's stacked experts and picking tiles with ``configs.choose_config`` from the
tuned table for this device, if one exists.

Numerics. FP8 weights (``w13_scale`` given) run the block-FP8 W8A8 recipe of
``ref.moe_experts_fp8_ref``: x and the activation are quantised per token per 128 channels, so the
result differs from the weight-only reference (``moe_experts_ref``, the torch backend) by the
activation rounding (a few 1e-2 relative). Plain weights run in their own dtype with fp32
accumulation and match ``moe_experts_ref`` to rounding. The shared expert is not included.
"""

from __future__ import annotations

import torch

from glmlab.kernels.fp8.quant_triton import quant_act_fp8_triton
from glmlab.kernels.moe.act_triton import combine, swiglu, swiglu_quant
from glmlab.kernels.moe.configs import KernelConfig, MoEShape, cached_table, choose_config
from glmlab.kernels.moe.gemm_triton import moe_gemm_down, moe_gemm_up
from glmlab.kernels.moe.routing_triton import AlignedPairs, align_pairs


def fused_moe(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, limit: float, w13_scale: torch.Tensor | None = None,
              w2_scale: torch.Tensor | None = None, block: tuple[int, int] = (128, 128),
              configs: tuple[KernelConfig, KernelConfig] | None = None,
              fuse_act_quant: bool = True) -> torch.Tensor:
    """Weighted sum of each token's routed experts.

    Args:
        x: [T, D] activations (bf16 in production).  ids: [T, A] expert ids (outside [0, E):
            skipped, as for another EP rank's experts).  weights: [T, A] routing weights (already
            renormalised and scaled).
        w13: [E, 2I, D] gate rows then up rows; w2: [E, D, I]. E4M3 with ``w13_scale``
            [E, 2I/128, D/128] and ``w2_scale`` [E, D/128, I/128], or plain (then no scales).
        limit: swiglu_limit.  block: the FP8 weight block.
        configs: (gate_up, down) tiles with one BLOCK_SIZE_M; default ``choose_config(T)``.
        fuse_act_quant: False runs SwiGLU and the FP8 quantisation as two kernels (the unfused
            baseline; same bits).
    Returns:
        [T, D] in x.dtype.

    Example:
        >>> out = fused_moe(x, ids, w, experts.w13, experts.w2, 10.0, experts.w13_scale,
        ...                 experts.w2_scale)
    """
    x = x.contiguous()
    up_cfg, down_cfg = configs or choose_config(x.shape[0])
    if up_cfg.block_m != down_cfg.block_m:
        raise ValueError("gate_up and down configs must share BLOCK_SIZE_M (one alignment)")
    align = align_pairs(ids, w13.shape[0], up_cfg.block_m)
    return fused_moe_aligned(x, ids, weights, w13, w2, limit, w13_scale, w2_scale, block, align,
                             (up_cfg, down_cfg), fuse_act_quant)


def fused_moe_aligned(x, ids, weights, w13, w2, limit, w13_scale, w2_scale, block,
                      align: AlignedPairs, configs: tuple[KernelConfig, KernelConfig],
                      fuse_act_quant: bool = True) -> torch.Tensor:
    """``fused_moe`` after the alignment (the tuner and benchmarks reuse one alignment)."""
    if (w13_scale is None) != (w2_scale is None):
        raise ValueError("give both weight scales (block-FP8) or neither (plain weights)")
    fp8 = w13_scale is not None
    up_cfg, down_cfg = configs
    if fp8:
        xq, xs = quant_act_fp8_triton(x, block[1])
    else:
        xq, xs = x, None
    h = moe_gemm_up(xq, xs, w13, w13_scale, align, up_cfg, x.dtype, block)  # [rows, 2I]
    if not fp8:
        hq, hs = swiglu(h, limit, align.num_padded), None
    elif fuse_act_quant:
        hq, hs = swiglu_quant(h, limit, align.num_padded, block[1])
    else:
        hq, hs = quant_act_fp8_triton(swiglu(h, limit, align.num_padded), block[1],
                                      align.num_padded)
    pair_out = moe_gemm_down(hq, hs, w2, w2_scale, weights, align, down_cfg, x.dtype, block)
    return combine(pair_out, ids, w13.shape[0])


def experts_shape(experts, top_k: int) -> MoEShape:
    """The ``MoEShape`` of a model's ``Experts`` module (glmlab.model.moe)."""
    e, two_i, d = experts.w13.shape
    dtype = "fp8w8a8" if experts.w13_scale is not None else str(experts.w13.dtype).split(".")[-1]
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)
    return MoEShape(e, top_k, d, two_i // 2, dtype, tuple(experts.block))


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def moe_experts_triton(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, experts
                       ) -> torch.Tensor:
    """Model backend ``moe_experts`` (routed experts only): [T, D] -> [T, D] in x.dtype."""
    shape = experts_shape(experts, ids.shape[1])
    table = cached_table(shape, device_name(x.device))
    return fused_moe(x, ids, weights, experts.w13, experts.w2, experts.limit, experts.w13_scale,
                     experts.w2_scale, tuple(experts.block), choose_config(x.shape[0], table))
