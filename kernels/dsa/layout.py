"""Byte layouts of one cached MLA latent row (one token, one DSA layer), defined once.

The cache (``glmlab.cache``) stores rows in one of these layouts and the sparse-MLA kernels read
them; both import this module, so a writer and a reader can never disagree on a byte offset
(docs/techniques.md section 4.4, docs/model.md section 3):

| format       | bytes per token (R = 512)           | storage tensor                      |
|--------------|-------------------------------------|-------------------------------------|
| `BF16`       | 1024: R bf16                         | bfloat16 [N, R]                     |
| `FP8_RAW`    | 512: R e4m3, no scale (scale 1)      | float8_e4m3fn [N, R]                |
| `FP8_SCALED` | 528: R e4m3, then R/128 fp32 scales  | uint8 [N, R + 4 * R/128]            |

FP8_SCALED scale = absmax(128-channel group) / 448, no epsilon (sglang's quantiser); an all-zero
group stores scale 0 and zero values. FP8_RAW saturates to +-448 (a plain e4m3 cast would turn
out-of-range values into NaN). Little-endian fp32 scales, as the GPU reads them.

This module knows bytes and numbers only: which slot a token lives in is the cache's business.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


class KVFormat(enum.Enum):
    BF16 = "bf16"
    FP8_RAW = "fp8_raw"
    FP8_SCALED = "fp8_scaled"


@dataclass(frozen=True)
class MlaKVLayout:
    """One latent row of ``rank`` channels in ``format``; scales cover ``scale_group`` channels.

    Example:
        >>> lay = MlaKVLayout(KVFormat.FP8_SCALED, rank=512)
        >>> lay.bytes_per_token, lay.scale_offset, lay.num_scales
        (528, 512, 4)
    """

    format: KVFormat
    rank: int = 512
    scale_group: int = 128

    def __post_init__(self):
        if self.rank <= 0 or self.rank % 16:
            raise ValueError(f"rank must be a positive multiple of 16, got {self.rank}")
        if self.format is KVFormat.FP8_SCALED and self.rank % self.group:
            raise ValueError(f"rank {self.rank} is not a multiple of scale group {self.group}")

    @property
    def group(self) -> int:
        """Channels per scale (a rank below ``scale_group`` has one group: the whole row)."""
        return min(self.scale_group, self.rank)

    @property
    def value_bytes(self) -> int:
        return self.rank * (2 if self.format is KVFormat.BF16 else 1)

    @property
    def num_scales(self) -> int:
        return self.rank // self.group if self.format is KVFormat.FP8_SCALED else 0

    @property
    def scale_offset(self) -> int:
        """Byte offset of the first fp32 scale in a row (= value_bytes)."""
        return self.value_bytes

    @property
    def bytes_per_token(self) -> int:
        return self.value_bytes + 4 * self.num_scales

    @property
    def storage_dtype(self) -> torch.dtype:
        return {KVFormat.BF16: torch.bfloat16, KVFormat.FP8_RAW: FP8,
                KVFormat.FP8_SCALED: torch.uint8}[self.format]

    @property
    def row_width(self) -> int:
        """Elements per row of the storage tensor."""
        return self.bytes_per_token if self.format is KVFormat.FP8_SCALED else self.rank

    def empty(self, num_tokens: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Zeroed storage for ``num_tokens`` rows."""
        return torch.zeros(num_tokens, self.row_width, dtype=self.storage_dtype, device=device)

    def matches(self, storage: torch.Tensor) -> bool:
        return (storage.dtype == self.storage_dtype and storage.dim() == 2
                and storage.shape[1] == self.row_width)

    @classmethod
    def of(cls, storage: torch.Tensor, rank: int) -> MlaKVLayout:
        """The layout whose storage looks like ``storage`` (dtype + row width identify it)."""
        for fmt in KVFormat:
            lay = cls(fmt, rank)
            if lay.matches(storage):
                return lay
        known = [(str(cls(f, rank).storage_dtype), cls(f, rank).row_width) for f in KVFormat]
        raise ValueError(f"no MLA KV layout of rank {rank} stores {storage.dtype} rows of width "
                         f"{storage.shape[-1]}; expected one of {known}")

    # ----------------------------------------------------------------------------------------
    def pack(self, latent: torch.Tensor) -> torch.Tensor:
        """[N, R] latent (any float dtype) -> storage rows [N, row_width] of ``storage_dtype``."""
        if latent.shape[-1] != self.rank:
            raise ValueError(f"latent has {latent.shape[-1]} channels, layout expects {self.rank}")
        if self.format is KVFormat.BF16:
            return latent.to(torch.bfloat16).contiguous()
        x = latent.float()
        if self.format is KVFormat.FP8_RAW:
            return x.clamp(-FP8_MAX, FP8_MAX).to(FP8).contiguous()
        groups = x.view(x.shape[0], self.num_scales, self.group)  # [N, G, group]
        scale = groups.abs().amax(dim=-1) / FP8_MAX  # [N, G]
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        values = (groups / safe[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(x.shape[0], -1)
        return torch.cat([values.view(torch.uint8), scale.contiguous().view(torch.uint8)], dim=1)

    def unpack(self, rows: torch.Tensor) -> torch.Tensor:
        """Storage rows [N, row_width] -> [N, R] fp32 latent (exact: e4m3 x fp32 scale in fp32)."""
        if not self.matches(rows):
            raise ValueError(f"{self} cannot read {rows.dtype} rows of shape {tuple(rows.shape)}")
        if self.format is not KVFormat.FP8_SCALED:
            return rows.float()
        values = rows[:, : self.rank].contiguous().view(FP8).float()
        scale = rows[:, self.scale_offset:].contiguous().view(torch.float32)  # [N, G]
        values = values.view(rows.shape[0], self.num_scales, self.group)
        return (values * scale[..., None]).flatten(1)

    def as_bytes(self, rows: torch.Tensor) -> torch.Tensor:
        """The same rows as raw bytes [N, bytes_per_token] (what a transfer or a kernel sees)."""
        return rows.contiguous().view(torch.uint8)


BF16_512 = MlaKVLayout(KVFormat.BF16, 512)
FP8_RAW_512 = MlaKVLayout(KVFormat.FP8_RAW, 512)
FP8_SCALED_512 = MlaKVLayout(KVFormat.FP8_SCALED, 512)
