"""A DFlash2 draft model split over a tensor-parallel group, as the target's TP splits its layers.

Each draft layer keeps H/tp query heads and their KV heads (HKV/tp each; with fewer KV heads than
ranks, rank r keeps KV head r * HKV // tp, replicated as grouped-query TP does), the rows of
``q_proj`` / ``k_proj`` / ``v_proj`` that make them and the matching columns of ``o_proj``, which
becomes a ``RowParallelLinear`` (one all-reduce); the SwiGLU MLP keeps I/tp channels and its
``down_proj`` all-reduces too. ``fc`` (target features -> context), the norms and the candidate
selector are replicated (every rank projects every context token and walks the same candidates).
So a rank's draft KV holds its KV heads only (``speculative.memory.draft_kv_bytes_per_token``).

The shard is an ordinary ``DFlashDraftModel`` whose config has the per-rank head and channel
counts: ``DFlashDrafter`` drives it unchanged. Its forward must run in step with the other ranks.
"""

from __future__ import annotations

import dataclasses

import torch

from glmlab.distributed.tp import RowParallelLinear, narrow_linear
from glmlab.model.layers import Linear
from glmlab.speculative.dflash import DFlashDraftModel


def draft_shard_config(cfg, rank: int, tp: int):
    """(per-rank config, first KV head this rank keeps)."""
    if cfg.num_heads % tp or cfg.intermediate_size % tp:
        raise ValueError(f"a draft with {cfg.num_heads} heads and {cfg.intermediate_size} MLP "
                         f"channels cannot be split over {tp} ranks")
    if cfg.num_kv_heads % tp == 0:
        kv, first = cfg.num_kv_heads // tp, rank * (cfg.num_kv_heads // tp)
    elif tp % cfg.num_kv_heads == 0:
        kv, first = 1, rank * cfg.num_kv_heads // tp
    else:
        raise ValueError(f"{cfg.num_kv_heads} draft KV heads fit neither split nor replicated "
                         f"over {tp} ranks")
    local = dataclasses.replace(cfg, num_heads=cfg.num_heads // tp, num_kv_heads=kv,
                                intermediate_size=cfg.intermediate_size // tp)
    return local, first


def _row_parallel(linear: Linear, start: int, length: int, group) -> RowParallelLinear:
    with torch.device("meta"):
        into = RowParallelLinear(length, linear.out_features, group)
    return narrow_linear(linear, 1, start, length, into)


def shard_draft(draft: DFlashDraftModel, rank: int, tp: int, group) -> DFlashDraftModel:
    """Rank ``rank``'s shard of ``draft`` (a new model; replicated modules are shared)."""
    if tp == 1:
        return draft
    cfg, kv_first = draft_shard_config(draft.cfg, rank, tp)
    with torch.device("meta"):
        shard = DFlashDraftModel(cfg)
    for name in ("fc", "hidden_norm", "norm", "selector"):
        setattr(shard, name, getattr(draft, name))
    dh, h, kv, inter = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size
    for full, part in zip(draft.layers, shard.layers, strict=True):
        part.input_layernorm = full.input_layernorm
        part.post_attention_layernorm = full.post_attention_layernorm
        a, b = full.self_attn, part.self_attn
        b.q_norm, b.k_norm = a.q_norm, a.k_norm
        narrow_linear(a.q_proj, 0, rank * h * dh, h * dh, b.q_proj)
        narrow_linear(a.k_proj, 0, kv_first * dh, kv * dh, b.k_proj)
        narrow_linear(a.v_proj, 0, kv_first * dh, kv * dh, b.v_proj)
        b.o_proj = _row_parallel(a.o_proj, rank * h * dh, h * dh, group)
        narrow_linear(full.gate_proj, 0, rank * inter, inter, part.gate_proj)
        narrow_linear(full.up_proj, 0, rank * inter, inter, part.up_proj)
        part.down_proj = _row_parallel(full.down_proj, rank * inter, inter, group)
    return shard.eval()
