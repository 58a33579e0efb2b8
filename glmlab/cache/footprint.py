"""A cache's number formats and what one GPU's cache costs in them (its footprint).

``cache_dtypes`` turns the format choices (``kv_dtype``, ``index_dtype``, ``state_dtype``: an
``EngineConfig`` or anything with those fields) into the storage dtypes. ``CacheFootprint`` is the
bytes per token slot and per state slot for any model and formats, read off a ``ModelCache`` built
on the meta device (nothing is allocated), so the budget and the storage that runs can never
disagree. Tensor parallelism shards the KDA heads (and so the recurrent and conv state) over
``tp`` ranks; the MLA latent and the indexer keys have no head axis and are replicated on every
rank, as in SGLang's DSA pool. A drafter's KV per token is set by its owner
(``draft_bytes_per_token``; DFlash2 draft KV shards its heads too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import torch

from glmlab.cache.storage import CacheDtypes, ModelCache
from glmlab.config import ModelConfig
from glmlab.core import IndexDtype, KVDtype, StateDtype


@dataclass(frozen=True)
class CacheFootprint:
    latent_bytes_per_token: int  # all DSA layers
    index_bytes_per_token: float  # pooled indexer keys, amortised over kpool tokens
    draft_bytes_per_token: int
    kda_state_bytes_per_slot: int  # recurrent + conv, all KDA layers ("recurrent/conv state")
    tail_bytes_per_slot: int  # DSA index tails, all DSA layers
    num_dsa_layers: int
    num_kda_layers: int
    formats: str  # e.g. "latent fp8, keys fp8, state bf16"

    @property
    def kv_bytes_per_token(self) -> float:
        return self.latent_bytes_per_token + self.index_bytes_per_token

    @property
    def state_bytes_per_slot(self) -> int:
        return self.kda_state_bytes_per_slot + self.tail_bytes_per_slot

    @classmethod
    def of(cls, cfg: ModelConfig, dtypes: CacheDtypes, tp: int = 1,
           with_mtp: bool = False) -> CacheFootprint:
        if cfg.kda.num_heads % tp:
            raise ValueError(f"tp={tp} does not divide the {cfg.kda.num_heads} KDA heads")
        per_rank = dataclasses.replace(cfg, kda=dataclasses.replace(
            cfg.kda, num_heads=cfg.kda.num_heads // tp))
        kpool = cfg.dsa.index_kpool
        meta = ModelCache(per_rank, kpool * 16, 1, page_size=kpool * 16, dtypes=dtypes,
                          device="meta", with_mtp=with_mtp)
        row = lambda t: t[0].numel() * t.element_size()  # noqa: E731
        return cls(
            latent_bytes_per_token=meta.latent_bytes_per_token(),
            index_bytes_per_token=meta.index_bytes_per_token(),
            draft_bytes_per_token=0,
            kda_state_bytes_per_slot=sum(row(t) for t in (*meta.conv.values(),
                                                           *meta.recurrent.values())),
            tail_bytes_per_slot=sum(row(t) for t in meta.index_tail.values()),
            num_dsa_layers=len(meta.latent), num_kda_layers=len(meta.conv),
            formats=_formats(dtypes))


def _name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
            torch.float8_e4m3fn: "fp8"}.get(dtype, str(dtype))


def _formats(d: CacheDtypes) -> str:
    return (f"latent {_name(d.latent)}, keys {_name(d.pool_keys)}, "
            f"state {_name(d.recurrent)}, conv {_name(d.conv)}")


class CacheFormats(Protocol):
    kv_dtype: KVDtype
    index_dtype: IndexDtype
    state_dtype: StateDtype


def cache_dtypes(cfg: CacheFormats, model_dtype: torch.dtype) -> CacheDtypes:
    """The storage formats a config asks for (``auto`` = the model dtype)."""
    latent = {KVDtype.AUTO: model_dtype, KVDtype.BF16: torch.bfloat16,
              KVDtype.FP8: torch.float8_e4m3fn}[cfg.kv_dtype]
    keys = torch.float8_e4m3fn if cfg.index_dtype is IndexDtype.FP8 else model_dtype
    state = torch.float32 if cfg.state_dtype is StateDtype.FP32 else torch.bfloat16
    tail = model_dtype if keys != torch.float8_e4m3fn else torch.bfloat16
    return CacheDtypes(latent=latent, pool_keys=keys, recurrent=state, conv=model_dtype,
                       tail=tail)
