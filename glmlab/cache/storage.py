"""The cache tensors of one model instance, addressed by token slots and state slots.

Per DSA layer (the main layers and the MTP layer):
- ``latent``      [num_token_slots, R]           the MLA latent c of every cached position,
- ``pool_keys``   [num_token_slots / kpool, DI]  one compressed indexer key per complete pool,
- ``index_tail``  [num_state_slots, kpool, 2*DI] per request: raw (key, gate) rows of the
                                                 incomplete pool, consumed when it completes.
Per KDA layer:
- ``conv``        [num_state_slots, 3*H*K, W-1]  the last W-1 pre-conv inputs,
- ``recurrent``   [num_state_slots, H, K, V]     the delta-rule state.
(A DFlash2 drafter keeps its own K/V rows, at the same token slots, with the drafter.)

Number formats (``CacheDtypes``): a float dtype stores values as they are. ``float8_e4m3fn``
selects the FP8 formats the DSA kernels read, quantised on write and dequantised on read:
- latent: ``MlaKVLayout(FP8_SCALED)`` rows (``glmlab.kernels.dsa.layout``): R e4m3 values, then
  one fp32 scale per 128 channels, stored as uint8 [num_token_slots, R + 4R/128] (528 B for R=512);
- pooled keys: e4m3 [pools, DI] plus ``pool_key_scales`` fp32 [pools], one absmax/448 scale per
  pooled key (``quantize_pool_keys_ref``): (128 + 4) / 4 = 33 B per token for DI=128.

This module owns storage and its number formats only. Which slots belong to whom (free lists,
refcounts, prefix sharing) is the business of the pools built on top of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glmlab.config import ModelConfig
from glmlab.kernels.dsa.layout import KVFormat, MlaKVLayout
from glmlab.kernels.dsa.ref import quantize_pool_keys_ref

FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class CacheDtypes:
    latent: torch.dtype = torch.bfloat16
    pool_keys: torch.dtype = torch.bfloat16
    recurrent: torch.dtype = torch.float32
    conv: torch.dtype = torch.bfloat16
    tail: torch.dtype = torch.bfloat16  # raw indexer rows of the incomplete pool

    @classmethod
    def like(cls, dtype: torch.dtype) -> CacheDtypes:
        """Everything in the model dtype except the fp32 recurrent state (HF's reference cache)."""
        return cls(latent=dtype, pool_keys=dtype, recurrent=torch.float32, conv=dtype, tail=dtype)


def _rows(num: int, width: int, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.zeros(num, width, dtype=dtype, device=device)


class ModelCache:
    def __init__(self, cfg: ModelConfig, num_token_slots: int, num_state_slots: int,
                 page_size: int = 64, dtypes: CacheDtypes | None = None,
                 device: torch.device | str = "cpu", with_mtp: bool = True):
        kpool = cfg.dsa.index_kpool
        if page_size % kpool or num_token_slots % page_size:
            raise ValueError(
                f"page_size ({page_size}) must be a multiple of index_kpool ({kpool}) and "
                f"num_token_slots ({num_token_slots}) a multiple of page_size")
        self.cfg, self.page_size = cfg, page_size
        self.num_token_slots, self.num_state_slots = num_token_slots, num_state_slots
        self.dtypes = dtypes or CacheDtypes()
        dt, d, k = self.dtypes, cfg.dsa, cfg.kda
        self.latent_fp8 = (MlaKVLayout(KVFormat.FP8_SCALED, d.kv_lora_rank)
                           if dt.latent == FP8 else None)
        self.keys_fp8 = dt.pool_keys == FP8
        dsa_layers = list(cfg.dsa_layers)
        if with_mtp and cfg.mtp_layer is not None:
            dsa_layers.append(cfg.mtp_layer)
        lat_w, lat_t = ((self.latent_fp8.row_width, torch.uint8) if self.latent_fp8
                        else (d.kv_lora_rank, dt.latent))
        num_pools = num_token_slots // kpool
        self.latent = {i: _rows(num_token_slots, lat_w, lat_t, device) for i in dsa_layers}
        self.pool_keys = {i: _rows(num_pools, d.index_head_dim, dt.pool_keys, device)
                          for i in dsa_layers}
        self.pool_key_scales = {i: torch.zeros(num_pools, dtype=torch.float32, device=device)
                                for i in dsa_layers} if self.keys_fp8 else {}
        self.index_tail = {i: torch.zeros(num_state_slots, kpool, 2 * d.index_head_dim,
                                          dtype=dt.tail, device=device) for i in dsa_layers}
        self.conv = {i: torch.zeros(num_state_slots, k.conv_channels, k.conv_kernel - 1,
                                    dtype=dt.conv, device=device) for i in cfg.kda_layers}
        self.recurrent = {i: torch.zeros(num_state_slots, k.num_heads, k.head_dim, k.head_dim,
                                         dtype=dt.recurrent, device=device) for i in cfg.kda_layers}

    @property
    def num_pages(self) -> int:
        return self.num_token_slots // self.page_size

    @property
    def device(self) -> torch.device:
        return next(iter(self.latent.values())).device

    # DSA rows -------------------------------------------------------------------------------
    def write_latent(self, layer: int, slots: torch.Tensor, c: torch.Tensor) -> None:
        rows = self.latent_fp8.pack(c) if self.latent_fp8 else c.to(self.dtypes.latent)
        self.latent[layer][slots] = rows

    def read_latent(self, layer: int, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        rows = self.latent[layer][slots]  # [..., row width]
        if self.latent_fp8 is None:
            return rows.to(dtype)
        flat = self.latent_fp8.unpack(rows.reshape(-1, rows.shape[-1]))
        return flat.view(*rows.shape[:-1], -1).to(dtype)

    def write_pool_keys(self, layer: int, pool_slots: torch.Tensor, keys: torch.Tensor) -> None:
        if self.keys_fp8:
            keys, scale = quantize_pool_keys_ref(keys)
            self.pool_key_scales[layer][pool_slots] = scale
        self.pool_keys[layer][pool_slots] = keys.to(self.dtypes.pool_keys)

    def read_pool_keys(self, layer: int, pool_slots: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
        keys = self.pool_keys[layer][pool_slots]
        if self.keys_fp8:
            return (keys.float() * self.pool_key_scales[layer][pool_slots][..., None]).to(dtype)
        return keys.to(dtype)

    # Per-request state ----------------------------------------------------------------------
    def _state_tensors(self) -> tuple[torch.Tensor, ...]:
        return (*self.conv.values(), *self.recurrent.values(), *self.index_tail.values())

    def reset_state(self, slots: torch.Tensor) -> None:
        """Zero the recurrent, conv and tail state of fresh requests."""
        for t in self._state_tensors():
            t[slots] = 0

    def copy_state(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every per-request state tensor from slots ``src`` to slots ``dst``."""
        for t in self._state_tensors():
            t[dst] = t[src]

    def state_bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self._state_tensors())

    def bytes_per_token(self) -> int:
        """Target KV bytes per token slot: latent rows plus pooled keys amortised over kpool."""
        return int(self.latent_bytes_per_token() + self.index_bytes_per_token())

    def latent_bytes_per_token(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.latent.values())

    def index_bytes_per_token(self) -> float:
        """Pooled keys (and their scales) amortised over the kpool tokens of a pool."""
        per_pool = sum(t[0].numel() * t.element_size()
                       for t in (*self.pool_keys.values(), *self.pool_key_scales.values()))
        return per_pool / self.cfg.dsa.index_kpool

    # For transfer engines -------------------------------------------------------------------
    def regions(self) -> dict[str, tuple[torch.Tensor, str]]:
        """Every storage tensor by name, with what its rows are addressed by: ``token`` (token
        slot), ``pool`` (token slot // kpool) or ``state`` (state slot). A page of S tokens is
        rows [p*S, (p+1)*S) of a token region and [p*S/kpool, (p+1)*S/kpool) of a pool region."""
        out: dict[str, tuple[torch.Tensor, str]] = {}
        for i in self.latent:
            out[f"latent.{i}"] = (self.latent[i], "token")
            out[f"pool_keys.{i}"] = (self.pool_keys[i], "pool")
            if self.keys_fp8:
                out[f"pool_key_scales.{i}"] = (self.pool_key_scales[i], "pool")
            out[f"index_tail.{i}"] = (self.index_tail[i], "state")
        for i in self.conv:
            out[f"conv.{i}"] = (self.conv[i], "state")
            out[f"recurrent.{i}"] = (self.recurrent[i], "state")
        return out

    def copy_from(self, src: ModelCache, src_pages: list[int], dst_pages: list[int],
                  src_slot: int, dst_slot: int) -> int:
        """Copy whole pages and one state slot from another cache of the same layout (the
        in-process reference of a KV + state transfer); returns the bytes copied."""
        if len(src_pages) != len(dst_pages) or src.page_size != self.page_size:
            raise ValueError("page lists or page sizes differ")
        theirs, moved = src.regions(), 0
        s, kpool = self.page_size, self.cfg.dsa.index_kpool
        for name, (dst, unit) in self.regions().items():
            if name not in theirs or theirs[name][0].shape[1:] != dst.shape[1:]:
                raise ValueError(f"cache layouts differ at {name}")
            rows_per_page = {"token": s, "pool": s // kpool, "state": 0}[unit]
            if unit == "state":
                idx_src, idx_dst = [src_slot], [dst_slot]
            else:
                idx_src = [p * rows_per_page + r for p in src_pages for r in range(rows_per_page)]
                idx_dst = [p * rows_per_page + r for p in dst_pages for r in range(rows_per_page)]
            if idx_src:
                rows = theirs[name][0][torch.tensor(idx_src, device=theirs[name][0].device)]
                dst[torch.tensor(idx_dst, device=dst.device)] = rows.to(dst.device)
                moved += rows.numel() * rows.element_size()
        return moved
