"""The cache tensors of one model instance, addressed by token slots and state slots.

Per DSA layer (the main layers and the MTP layer):
- ``latent``      [num_token_slots, R]           the MLA latent c of every cached position,
- ``pool_keys``   [num_token_slots / kpool, DI]  one compressed indexer key per complete pool,
- ``index_tail``  [num_state_slots, kpool, 2*DI] per request: raw (key, gate) rows of the
                                                 incomplete pool, consumed when it completes.
Per KDA layer:
- ``conv``        [num_state_slots, 3*H*K, W-1]  the last W-1 pre-conv inputs,
- ``recurrent``   [num_state_slots, H, K, V]     the delta-rule state.

This module owns storage and its number formats only. Which slots belong to whom (free lists,
refcounts, prefix sharing) is the business of the pools built on top of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glmlab.config import ModelConfig


@dataclass(frozen=True)
class CacheDtypes:
    latent: torch.dtype = torch.bfloat16
    pool_keys: torch.dtype = torch.bfloat16
    recurrent: torch.dtype = torch.float32
    conv: torch.dtype = torch.bfloat16

    @classmethod
    def like(cls, dtype: torch.dtype) -> CacheDtypes:
        """Everything in the model dtype except the fp32 recurrent state (HF's reference cache)."""
        return cls(latent=dtype, pool_keys=dtype, recurrent=torch.float32, conv=dtype)


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
        dsa_layers = list(cfg.dsa_layers)
        if with_mtp and cfg.mtp_layer is not None:
            dsa_layers.append(cfg.mtp_layer)
        self.latent = {i: torch.zeros(num_token_slots, d.kv_lora_rank, dtype=dt.latent,
                                      device=device) for i in dsa_layers}
        self.pool_keys = {i: torch.zeros(num_token_slots // kpool, d.index_head_dim,
                                         dtype=dt.pool_keys, device=device) for i in dsa_layers}
        self.index_tail = {i: torch.zeros(num_state_slots, kpool, 2 * d.index_head_dim,
                                          dtype=dt.pool_keys, device=device) for i in dsa_layers}
        self.conv = {i: torch.zeros(num_state_slots, k.conv_channels, k.conv_kernel - 1,
                                    dtype=dt.conv, device=device) for i in cfg.kda_layers}
        self.recurrent = {i: torch.zeros(num_state_slots, k.num_heads, k.head_dim, k.head_dim,
                                         dtype=dt.recurrent, device=device) for i in cfg.kda_layers}

    @property
    def num_pages(self) -> int:
        return self.num_token_slots // self.page_size

    # DSA rows -------------------------------------------------------------------------------
    def write_latent(self, layer: int, slots: torch.Tensor, c: torch.Tensor) -> None:
        self.latent[layer][slots] = c.to(self.dtypes.latent)

    def read_latent(self, layer: int, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.latent[layer][slots].to(dtype)

    def write_pool_keys(self, layer: int, pool_slots: torch.Tensor, keys: torch.Tensor) -> None:
        self.pool_keys[layer][pool_slots] = keys.to(self.dtypes.pool_keys)

    def read_pool_keys(self, layer: int, pool_slots: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
        return self.pool_keys[layer][pool_slots].to(dtype)

    # Per-request state ----------------------------------------------------------------------
    def reset_state(self, slots: torch.Tensor) -> None:
        """Zero the recurrent, conv and tail state of fresh requests."""
        for t in (*self.conv.values(), *self.recurrent.values(), *self.index_tail.values()):
            t[slots] = 0

    def copy_state(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every per-request state tensor from slots ``src`` to slots ``dst``."""
        for t in (*self.conv.values(), *self.recurrent.values(), *self.index_tail.values()):
            t[dst] = t[src]

    def state_bytes_per_slot(self) -> int:
        tensors = (*self.conv.values(), *self.recurrent.values(), *self.index_tail.values())
        return sum(t[0].numel() * t.element_size() for t in tensors)

    def bytes_per_token(self) -> int:
        kpool = self.cfg.dsa.index_kpool
        per_layer = [self.latent[i][0].numel() * self.latent[i].element_size()
                     + self.pool_keys[i][0].numel() * self.pool_keys[i].element_size() / kpool
                     for i in self.latent]
        return int(sum(per_layer))
