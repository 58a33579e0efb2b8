"""FP8 E4M3 row formats of the cache: the scaled MLA latent and the pooled indexer key.

One layout serves both (TECHNIQUES.md section 4.4, FlashMLA's NoPE layout):

    row = [ V e4m3 values | ceil(V / group) fp32 scales ]      scale_g = amax(group g) / 448
    value = e4m3 * scale_g                                     (dequantised in fp32)

- MLA latent: V = kv_lora_rank = 512, group 128 -> 512 + 4*4 = 528 bytes per token per layer.
- Pooled indexer key: V = index_head_dim = 128, group 128 -> 132 bytes per pool = 33 B/token.

Rows are stored as uint8 so the pools stay plain byte arrays (what a transfer engine or a kernel
reads). An all-zero group stores scale 0 and zero values (no epsilon, as SGLang's quantiser).
The latent layout is byte-for-byte ``glmlab.kernels.dsa.layout.MlaKVLayout(FP8_SCALED)``, the
format the DSA kernels read. This module knows byte layouts only, nothing about slots or layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448


@dataclass(frozen=True)
class ScaledFP8Layout:
    values: int  # e4m3 values per row
    group: int = 128  # channels sharing one fp32 scale

    @property
    def num_scales(self) -> int:
        return -(-self.values // self.group)

    @property
    def bytes_per_row(self) -> int:
        return self.values + 4 * self.num_scales

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[..., V] float -> [..., bytes_per_row] uint8 (quantise on write)."""
        lead, v = x.shape[:-1], x.shape[-1]
        if v != self.values:
            raise ValueError(f"row width {v} != layout width {self.values}")
        pad = self.num_scales * self.group - v
        groups = torch.nn.functional.pad(x.float(), (0, pad)).unflatten(-1, (-1, self.group))
        scale = groups.abs().amax(-1) / FP8_MAX  # [..., G]
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = (groups / safe[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).flatten(-2)[..., :v]
        out = torch.cat([q.contiguous().view(torch.uint8),
                         scale.contiguous().view(torch.uint8)], dim=-1)
        return out.reshape(*lead, self.bytes_per_row)

    def unpack(self, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[..., bytes_per_row] uint8 -> [..., V] in ``dtype`` (product taken in fp32)."""
        rows = rows.contiguous()
        q = rows[..., : self.values].view(FP8).float()
        scale = rows[..., self.values:].contiguous().view(torch.float32)  # [..., G]
        s = scale.repeat_interleave(self.group, dim=-1)[..., : self.values]
        return (q * s).to(dtype)


def latent_layout(kv_lora_rank: int) -> ScaledFP8Layout:
    """A rank below 128 has one group: the whole row (as MlaKVLayout)."""
    return ScaledFP8Layout(values=kv_lora_rank, group=min(128, kv_lora_rank))


def pool_key_layout(index_head_dim: int) -> ScaledFP8Layout:
    """One scale per pooled key, whatever its width."""
    return ScaledFP8Layout(values=index_head_dim, group=index_head_dim)
