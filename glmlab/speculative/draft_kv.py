"""Draft-model K/V for DFlash2, one row per *target* token slot, in BF16 or FP8.

DFlash2's draft layers never run over context tokens: the K/V of every committed position is a
projection of the target's hidden features there (``glmlab.speculative.dflash``), written at the
same token slot the target uses, so the draft KV needs no allocator of its own: whoever owns a
target slot owns its draft row, and freeing the page frees both (docs/techniques.md section 1.2).

Layouts per draft layer (HKV kv heads of Dh channels):
- ``bf16``: K and V ``[slots, HKV, Dh]`` bf16, 2 * HKV * Dh * 2 bytes per token;
- ``fp8``:  K and V ``[slots, HKV, Dh]`` E4M3 plus one fp32 scale per (token, head) each,
  2 * HKV * (Dh + 4) bytes per token (the reference deployment's open direction: "FP8 draft KV").
Rows are quantised on write and dequantised on read; the reader always gets the compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from glmlab.kernels.fp8.ref import FP8, quant_act_fp8

DraftKVDtype = Literal["bf16", "fp8"]


@dataclass(frozen=True)
class DraftKVLayout:
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: DraftKVDtype

    @property
    def bytes_per_token(self) -> int:
        per_head = self.head_dim * 2 if self.dtype == "bf16" else self.head_dim + 4
        return 2 * self.num_layers * self.kv_heads * per_head  # K and V


class DraftKVStore:
    def __init__(self, layout: DraftKVLayout, num_token_slots: int,
                 device: torch.device | str = "cpu"):
        if layout.dtype not in ("bf16", "fp8"):
            raise ValueError(f"draft KV dtype must be bf16 or fp8, got {layout.dtype!r}")
        self.layout, self.num_token_slots = layout, num_token_slots
        shape = (num_token_slots, layout.kv_heads, layout.head_dim)
        store = torch.bfloat16 if layout.dtype == "bf16" else FP8
        self.k = [torch.zeros(shape, dtype=store, device=device) for _ in range(layout.num_layers)]
        self.v = [torch.zeros(shape, dtype=store, device=device) for _ in range(layout.num_layers)]
        if layout.dtype == "fp8":
            scale = (num_token_slots, layout.kv_heads)
            self.k_scale = [torch.ones(scale, device=device) for _ in range(layout.num_layers)]
            self.v_scale = [torch.ones(scale, device=device) for _ in range(layout.num_layers)]

    @property
    def nbytes(self) -> int:
        return self.layout.bytes_per_token * self.num_token_slots

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots [T]; k, v [T, HKV, Dh] in any float dtype."""
        if self.layout.dtype == "bf16":
            self.k[layer][slots] = k.to(torch.bfloat16)
            self.v[layer][slots] = v.to(torch.bfloat16)
            return
        for rows, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            t, h, d = x.shape
            q, s = quant_act_fp8(x.reshape(t * h, d), group=d)  # one scale per (token, head)
            rows[layer][slots] = q.view(t, h, d)
            scales[layer][slots] = s.view(t, h)

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor,
                                         torch.Tensor | None, torch.Tensor | None]:
        """Layer ``layer``'s stored K, V [slots, HKV, Dh] and, for fp8, their fp32 scales
        [slots, HKV] (else None), as they are: for kernels that read rows in place by slot."""
        if self.layout.dtype == "bf16":
            return self.k[layer], self.v[layer], None, None
        return self.k[layer], self.v[layer], self.k_scale[layer], self.v_scale[layer]

    def read(self, layer: int, slots: torch.Tensor,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """slots [...] -> k, v [..., HKV, Dh] in ``dtype``."""
        if self.layout.dtype == "bf16":
            return self.k[layer][slots].to(dtype), self.v[layer][slots].to(dtype)
        k = self.k[layer][slots].float() * self.k_scale[layer][slots][..., None]
        v = self.v[layer][slots].float() * self.v_scale[layer][slots][..., None]
        return k.to(dtype), v.to(dtype)
