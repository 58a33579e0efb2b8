"""What speculative decoding costs in memory, per GPU: verify-window state and draft KV.

- Per state slot (every request that may verify): the conv window and indexer rows (both modes),
  plus the KDA recurrence record, which is where the modes differ: SNAPSHOT keeps D post-step
  states (D x H x K x V each), REPLAY keeps D x H x (K + V + K + 1) step inputs. Tensor parallelism
  shards the KDA heads (state, ring and conv channels) over ``tp`` ranks, as
  ``glmlab.cache.footprint`` does for the state itself.
- Per token slot (DFlash2): draft K/V rows, BF16 or FP8 (``glmlab.speculative.draft_kv``).

``fp8_draft_kv_saving`` answers the reference deployment's open question "what would FP8 draft KV
free?" from a
measured BF16 draft-KV footprint: FP8 stores Dh bytes + a 4-byte scale per head row instead of
2 * Dh bytes, whatever the number of draft layers and heads.
"""

from __future__ import annotations

import dataclasses

import torch

from glmlab.config import ModelConfig
from glmlab.speculative.commit import SpecStateStore
from glmlab.speculative.draft_kv import DraftKVLayout
from glmlab.speculative.replay import CommitMode


def per_rank(cfg: ModelConfig, tp: int) -> ModelConfig:
    """The KDA part of ``cfg`` as one of ``tp`` ranks holds it."""
    if cfg.kda.num_heads % tp:
        raise ValueError(f"tp={tp} does not divide the {cfg.kda.num_heads} KDA heads")
    return dataclasses.replace(cfg, kda=dataclasses.replace(cfg.kda,
                                                            num_heads=cfg.kda.num_heads // tp))


def spec_state_bytes(cfg: ModelConfig, width: int, act_dtype: torch.dtype = torch.bfloat16,
                     state_dtype: torch.dtype = torch.bfloat16, tp: int = 1) -> dict[str, dict]:
    """Per state slot and GPU, by part, for both commit modes."""
    rank = per_rank(cfg, tp)
    return {m.value: SpecStateStore.bytes_per_slot(rank, width, m, act_dtype, state_dtype)
            for m in CommitMode}


def fp8_draft_kv_saving(bf16_bytes: float, head_dim: int) -> dict[str, float]:
    """FP8 footprint of a BF16 draft-KV pool of ``bf16_bytes`` (same token capacity)."""
    fp8 = bf16_bytes * (head_dim + 4) / (2 * head_dim)
    return {"bf16_bytes": bf16_bytes, "fp8_bytes": fp8, "freed_bytes": bf16_bytes - fp8,
            "fp8_fraction": fp8 / bf16_bytes}


def draft_kv_bytes_per_token(layout: DraftKVLayout, tp: int = 1) -> int:
    """Per GPU: draft KV heads are split over the TP ranks (at least one head per rank)."""
    heads = max(1, layout.kv_heads // tp)
    return dataclasses.replace(layout, kv_heads=heads).bytes_per_token
