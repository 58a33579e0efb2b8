"""Torch references for the block-FP8 recipe (E4M3 values, fp32 multipliers).

- Weights: one scale per 128 x 128 block, stored as ``weight_scale_inv`` [ceil(N/128), ceil(K/128)];
  despite the name it is a plain multiplier: W = W_fp8 * scale[i // 128, j // 128].
- Activations: one scale per token per 128 channels, computed on the fly (dynamic).
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448


def dequant_block_fp8(
    w: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, block: tuple[int, int] = (128, 128)
) -> torch.Tensor:
    """[N, K] fp8 weight and its block scales -> [N, K] in ``dtype`` (product taken in fp32)."""
    n, k = w.shape[-2:]
    s = scale.float().repeat_interleave(block[0], dim=-2)[..., :n, :]
    s = s.repeat_interleave(block[1], dim=-1)[..., :k]
    return (w.float() * s).to(dtype)


def quant_block_fp8(
    w: torch.Tensor, block: tuple[int, int] = (128, 128)
) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., N, K] weight -> (fp8 weight, fp32 block scales [..., ceil(N/bn), ceil(K/bk)])."""
    *lead, n, k = w.shape
    bn, bk = block
    pn, pk = -n % bn, -k % bk
    wp = torch.nn.functional.pad(w.float(), (0, pk, 0, pn))
    blocks = wp.unflatten(-2, (-1, bn)).unflatten(-1, (-1, bk))  # [..., nb, bn, kb, bk]
    amax = blocks.abs().amax(dim=(-3, -1)).clamp(min=1e-12)  # [..., nb, kb]
    scale = amax / FP8_MAX
    q = (blocks / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    q = q.flatten(-2, -1).flatten(-3, -2)[..., :n, :k]
    return q.contiguous(), scale


def quant_act_fp8(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, K] activations -> (fp8 [T, K], fp32 scales [T, ceil(K/group)]), per token per group."""
    t, k = x.shape
    xp = torch.nn.functional.pad(x.float(), (0, -k % group)).view(t, -1, group)
    scale = xp.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    q = (xp / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).flatten(1)[:, :k]
    return q.contiguous(), scale


def linear_fp8_ref(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   block: tuple[int, int] = (128, 128),
                   residual: torch.Tensor | None = None) -> torch.Tensor:
    """What the block-FP8 GEMM computes: x quantised per token per 128 channels, both operands
    dequantised to fp32, one fp32 product, rounded to x.dtype; ``residual`` added after rounding.

    Args:
        x: [M, K] float activations.  weight: [N, K] E4M3.  weight_scale: [N/bn, K/128] fp32.
    Returns:
        [M, N] in x.dtype.
    """
    xq, xs = quant_act_fp8(x, block[1])
    a = dequant_block_fp8(xq, xs, torch.float32, (1, block[1]))
    y = (a @ dequant_block_fp8(weight, weight_scale, torch.float32, block).t()).to(x.dtype)
    return y if residual is None else (y.float() + residual.float()).to(x.dtype)
