"""The routed MoE on the persistent grouped kernels: align, quant, gate_up+act, down, combine.

``fused_moe_grouped`` is ``fused_moe`` (fused_moe.py, the previous version, kept for side-by-side
runs) with the gate_up GEMM's epilogue doing the clamped SwiGLU and the FP8 requantisation (no
bf16 activation round trip, one launch fewer) and both GEMMs on ``grouped_triton``'s persistent
TMA kernel. Same numerics contract: the block-FP8 W8A8 recipe of ``ref.moe_experts_fp8_ref``; bit
for bit the unfused path up to tensor-core accumulation order. Block-FP8 weights only.

``choose_grouped`` is the untuned tile choice by expected rows per local expert (decode: swap-AB
16/32-row tiles; prefill: 128-row tiles with x pre-gathered for TMA); ``GROUPED_CANDIDATES`` are
the configs the benchmark measures beside it. A ``GluonConfig`` pair (``GLUON_PREFILL``) runs
both GEMMs on ``grouped_gluon``'s warp-specialised kernel instead (x gathered and quantised into
128-aligned rows first), a ``GluonDecodeConfig`` pair (``GLUON_DECODE``) on
``grouped_gluon_decode``'s swapped one (rows aligned to 16/32/64); ``choose_gluon`` picks by
rows per expert. Both are benchmark/opt-in paths until an H200 run has validated them, and
need a CUDA device (Gluon has no interpreter). Nothing here reads tables or files.
"""

from __future__ import annotations

import torch

from glmlab.kernels.fp8.quant_triton import quant_act_fp8_triton
from glmlab.kernels.moe.act_triton import combine
from glmlab.kernels.moe.grouped_gluon import GluonConfig, gluon_down, gluon_up
from glmlab.kernels.moe.grouped_gluon_decode import (
    GluonDecodeConfig,
    gluon_decode_down,
    gluon_decode_up,
)
from glmlab.kernels.moe.grouped_triton import GroupedConfig, grouped_down, grouped_up
from glmlab.kernels.moe.permute_triton import gather_quant
from glmlab.kernels.moe.routing_triton import AlignedPairs, align_pairs

G = GroupedConfig
# (up, down) by regime; both of a pair share block_m (one alignment)
DECODE = (G(16, 128, 1, 4, 4, swap_ab=True), G(16, 128, 1, 4, 4, swap_ab=True))
SMALL = (G(32, 128, 8, 4, 4, swap_ab=True), G(32, 128, 8, 4, 4, swap_ab=True))
MEDIUM = (G(64, 128, 8, 8, 4), G(64, 128, 8, 4, 4))
PREFILL = (G(128, 128, 8, 8, 3, gather_a=False), G(128, 128, 8, 8, 4))
# warp-specialised Gluon kernel: gate_up 4 stages (217 KB of shared memory), down 3 (its bf16
# epilogue tiles leave no room for a 4th under 227 KB)
GLUON_PREFILL = (GluonConfig(stages=4), GluonConfig(stages=3))
GD = GluonDecodeConfig
# swapped (decode) Gluon kernel by token rows per tile (= the alignment); both GEMMs share it
GLUON_DECODE = {16: (GD(16, 6), GD(16, 6)), 32: (GD(32, 5), GD(32, 5)), 64: (GD(64, 4), GD(64, 4))}
GLUON_CANDIDATES = {
    "up": (GLUON_PREFILL[0], GluonConfig(stages=3), GluonConfig(stages=4, group_m=8),
           GluonConfig(stages=4, group_m=32)),
    "down": (GLUON_PREFILL[1], GluonConfig(stages=3, group_m=8),
             GluonConfig(stages=3, group_m=32)),
}
GLUON_DECODE_CANDIDATES = {
    "up": tuple(c[0] for c in GLUON_DECODE.values()) + (GD(32, 4, 1),),
    "down": tuple(c[1] for c in GLUON_DECODE.values()) + (GD(32, 4, 1),),
}

# What the benchmark times per GEMM beside choose_grouped's pick (AOT-checked for sm_90:
# aot.compile_grouped; warp_specialize only where Triton 3.6 accepts it, TMA operands).
GROUPED_CANDIDATES = {
    "up": (DECODE[0], G(16, 128, 1, 4, 5, swap_ab=True), SMALL[0],
           G(64, 128, 8, 8, 4, swap_ab=True), MEDIUM[0], G(64, 128, 8, 8, 4, gather_a=False),
           PREFILL[0], G(128, 128, 8, 8, 3), G(128, 128, 16, 8, 3, gather_a=False),
           G(128, 128, 8, 4, 3, gather_a=False, warp_specialize=True)),
    "down": (DECODE[1], G(16, 64, 1, 4, 4, swap_ab=True), SMALL[1],
             G(64, 128, 8, 4, 4, swap_ab=True), MEDIUM[1], G(64, 256, 8, 8, 3), PREFILL[1],
             G(128, 128, 16, 8, 4), G(128, 128, 8, 8, 5),
             G(128, 128, 8, 4, 3, warp_specialize=True)),
}


def up_config_for(block_m: int) -> GroupedConfig:
    """A gate_up config of the candidates for a given block_m (benchmarks make down inputs)."""
    return {16: DECODE[0], 32: SMALL[0], 64: MEDIUM[0]}.get(block_m, G(block_m, 128, 8, 8, 3))


def choose_grouped(num_tokens: int, num_experts: int, top_k: int
                   ) -> tuple[GroupedConfig, GroupedConfig]:
    """Untuned (up, down) configs for ``num_tokens`` tokens over ``num_experts`` local experts.

    The estimate is rows per expert if every pair were local (an EP rank sees fewer; a tuned
    table keyed by M should replace this)."""
    rows = num_tokens * top_k / max(num_experts, 1)
    if rows <= 12:
        return DECODE
    if rows <= 40:
        return SMALL
    if rows <= 160:
        return MEDIUM
    return PREFILL


def choose_gluon(num_tokens: int, num_experts: int, top_k: int
                 ) -> tuple[GluonDecodeConfig, GluonDecodeConfig] | tuple[GluonConfig, GluonConfig]:
    """Untuned Gluon (up, down) configs by expected rows per expert: the swapped decode kernel
    with the smallest token tile that holds the mean with room (16 / 32 / 64 rows), else the
    128-row prefill kernel. ``num_experts``: the experts the routes choose from (all ranks' under
    EP: a rank's experts get the same rows each)."""
    rows = num_tokens * top_k / max(num_experts, 1)
    for tok in (16, 32, 64):
        if rows <= 0.75 * tok:
            return GLUON_DECODE[tok]
    return GLUON_PREFILL


def quant_for(x: torch.Tensor, align: AlignedPairs, up_cfg: GroupedConfig | GluonConfig
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate_up GEMM's A operand: x quantised per token, or gathered into aligned rows."""
    if isinstance(up_cfg, GroupedConfig) and up_cfg.gather_a:
        return quant_act_fp8_triton(x, 128)
    return gather_quant(x, align, 128)


def fused_moe_grouped(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                      w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                      w2_scale: torch.Tensor, limit: float,
                      configs: tuple[GroupedConfig, GroupedConfig]
                      | tuple[GluonConfig, GluonConfig] | None = None,
                      align: AlignedPairs | None = None) -> torch.Tensor:
    """Weighted sum of each token's routed experts (block-FP8 weights).

    Args:
        x: [T, D] activations (bf16 in production).  ids: [T, A] expert ids (outside [0, E):
            skipped, another EP rank's experts).  weights: [T, A] routing weights.
        w13: [E, 2I, D] E4M3 + w13_scale [E, 2I/128, D/128]; w2: [E, D, I] E4M3 + w2_scale.
        configs: (gate_up, down) sharing block_m; default ``choose_grouped``; a pair of
            ``GluonConfig`` / ``GluonDecodeConfig`` runs the warp-specialised Gluon kernels
            (prefill / swapped decode; CUDA only; ``choose_gluon`` picks one).
        align: a precomputed alignment at that block_m (benchmarks reuse one).
    Returns:
        [T, D] in x.dtype.
    """
    x = x.contiguous()
    up_cfg, down_cfg = configs or choose_grouped(x.shape[0], w13.shape[0], ids.shape[1])
    if up_cfg.block_m != down_cfg.block_m:
        raise ValueError("gate_up and down configs must share block_m (one alignment)")
    if type(up_cfg) is not type(down_cfg):
        raise ValueError("gate_up and down configs run as a pair of one kernel family")
    if align is None:
        align = align_pairs(ids, w13.shape[0], up_cfg.block_m)
    xq, xs = quant_for(x, align, up_cfg)
    if isinstance(up_cfg, GluonConfig | GluonDecodeConfig):
        up, down = (gluon_up, gluon_down) if isinstance(up_cfg, GluonConfig) else \
            (gluon_decode_up, gluon_decode_down)
        h8, hs = up(xq, xs, w13, w13_scale, align, up_cfg, limit, x.dtype)
        pair_out = down(h8, hs, w2, w2_scale, weights, align, down_cfg, x.dtype)
        return combine(pair_out, ids, w13.shape[0])
    h8, hs = grouped_up(xq, xs, w13, w13_scale, align, up_cfg, limit, x.dtype)
    pair_out = grouped_down(h8, hs, w2, w2_scale, weights, align, down_cfg, x.dtype)
    return combine(pair_out, ids, w13.shape[0])
