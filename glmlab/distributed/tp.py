"""Tensor + expert parallelism for the engine, applied to an unchanged single-device ``GLM5Model``.

``apply_tp(model, groups)`` turns the model, in place, into this rank's shard. Every rank holds
the same activations [T, D] (the whole batch, as in decode); what is split is the weights, and
each split layer ends in one all-reduce of partial sums over the TP group:

- DSA (``shard_dsa``): heads H -> H/tp per rank: rows of ``q_b_proj`` and of ``kv_b_proj`` (each
  head's W_UK / W_UV block), columns of ``o_proj``. The latent c, the indexer and its pooled keys
  have no head axis: every rank computes them, writes the same latent rows and pools to its own
  cache and selects the same positions, then attends with its heads only.
- KDA (``kda_tp.shard_kda``): heads H -> H/tp, with their conv channels and recurrent state.
- dense MLPs and the shared expert: gate/up rows and down columns split (``shard_mlp``).
- routed experts (``TPMoE``): with ``ep = tp`` each rank keeps E/ep experts (``ep_moe.
  shard_experts_``); every rank routes every token (same router, same choices), runs only the
  token-expert pairs of its experts (other ranks' ids become -1, which the ``moe_experts``
  backends skip) and the partial outputs join the shared expert's partial sum in one all-reduce.
  With ``ep = 1`` every rank holds every expert and adds the routed output after the reduction.
- embedding, mHC, norms, router and lm_head are replicated.

The transformed model keeps its types and parameter names (``self_attn`` is still a
``DSAttention`` / ``KDAttention``, the MoE keeps ``gate / experts / shared_experts``), so backends
bind to it as before. ``model.cfg`` becomes ``kda_tp.shard_config(cfg, tp)``: what this rank's
cache holds (KDA state for its heads; the latent and indexer rows whole), so an ``Engine`` built
on the shard sizes its pools per GPU, as ``CacheFootprint.of(cfg, dtypes, tp)`` does. The MTP layer
is transformed like a decoder layer. The rank's forward must run in step with the other ranks
(``engine_tp``): each split layer is a collective.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from glmlab.config import ModelConfig
from glmlab.distributed.ep_moe import shard_experts_
from glmlab.distributed.kda_tp import shard_config, shard_kda
from glmlab.distributed.parallel import ProcessGroups
from glmlab.model.dsa import DSAttention
from glmlab.model.glm import GLM5Model
from glmlab.model.kda import KDAttention
from glmlab.model.layers import Linear
from glmlab.model.mlp import MLP
from glmlab.model.moe import MoE


class RowParallelLinear(Linear):
    """A ``Linear`` holding a slice of the input columns: y = all_reduce(x_local W_local^T)."""

    def __init__(self, in_features: int, out_features: int, group):
        super().__init__(in_features, out_features)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        dist.all_reduce(y, group=self.group)
        return y


def narrow_linear(linear: Linear, dim: int, start: int, length: int,
                  into: Linear | None = None) -> Linear:
    """Rows (``dim=0``) or columns (``dim=1``) [start, start + length) of ``linear`` as a new
    ``Linear`` (or into ``into``, a fresh one of the right shape). Block-FP8 weights stay FP8: the
    slice must then fall on block boundaries, and the scales are sliced with it."""
    out_f, in_f = linear.weight.shape
    shape = (length, in_f) if dim == 0 else (out_f, length)
    if into is None:
        with torch.device("meta"):
            into = Linear(shape[1], shape[0])
    if (into.out_features, into.in_features) != shape:
        raise ValueError(f"narrowed weight is {shape}, the target Linear holds "
                         f"{(into.out_features, into.in_features)}")
    weight = linear.weight.data.narrow(dim, start, length).clone()
    if linear.is_fp8:
        block = linear.block[dim]
        if start % block or length % block:
            raise ValueError(f"an FP8 weight can be split only on {block}-wide blocks: "
                             f"[{start}, {start + length}) along dim {dim} (load it with "
                             "fp8='dequantize' for this split)")
        scale = linear.weight_scale_inv.narrow(dim, start // block, length // block).clone()
        into.set_fp8(weight, scale, linear.block)
    else:
        into.weight = nn.Parameter(weight, requires_grad=False)
    return into


def _row_parallel(linear: Linear, start: int, length: int, group) -> RowParallelLinear:
    with torch.device("meta"):
        into = RowParallelLinear(length, linear.out_features, group)
    return narrow_linear(linear, 1, start, length, into)


def shard_dsa(attn: DSAttention, cfg: ModelConfig, rank: int, tp: int, group) -> DSAttention:
    """A new ``DSAttention`` with this rank's H/tp heads; everything without a head axis (q_a, the
    latent projection and norm, the indexer) is shared with ``attn``."""
    d = attn.cfg
    if d.num_heads % tp:
        raise ValueError(f"{d.num_heads} DSA heads cannot be split over {tp} ranks")
    h = d.num_heads // tp
    with torch.device("meta"):
        shard = DSAttention(dataclasses.replace(cfg, dsa=dataclasses.replace(d, num_heads=h)),
                            attn.layer_idx)
    for name in ("q_a_proj", "q_a_layernorm", "kv_a_proj_with_mqa", "kv_a_layernorm", "indexer"):
        setattr(shard, name, getattr(attn, name))
    dn, dv = d.qk_nope_head_dim, d.v_head_dim
    narrow_linear(attn.q_b_proj, 0, rank * h * dn, h * dn, shard.q_b_proj)
    narrow_linear(attn.kv_b_proj, 0, rank * h * (dn + dv), h * (dn + dv), shard.kv_b_proj)
    shard.o_proj = _row_parallel(attn.o_proj, rank * h * dv, h * dv, group)
    shard.attend = attn.attend
    return shard


def shard_mlp(mlp: MLP, rank: int, tp: int, group) -> MLP:
    """Intermediate channels I -> I/tp: gate/up rows, down columns. With ``group`` the down
    projection all-reduces (a dense layer); with ``group=None`` it returns this rank's partial
    sum (the shared expert, reduced together with the routed experts)."""
    inter = mlp.gate_proj.out_features
    if inter % tp:
        raise ValueError(f"MLP intermediate size {inter} cannot be split over {tp} ranks")
    n = inter // tp
    with torch.device("meta"):
        shard = MLP(mlp.gate_proj.in_features, n, mlp.limit)
    narrow_linear(mlp.gate_proj, 0, rank * n, n, shard.gate_proj)
    narrow_linear(mlp.up_proj, 0, rank * n, n, shard.up_proj)
    if group is not None:
        shard.down_proj = _row_parallel(mlp.down_proj, rank * n, n, group)
    else:
        narrow_linear(mlp.down_proj, 1, rank * n, n, shard.down_proj)
    return shard


class TPMoE(nn.Module):
    """Drop-in for a ``MoE`` on replicated tokens: routed experts split (EP) or whole, shared
    expert split, one all-reduce."""

    def __init__(self, moe: MoE, rank: int, tp: int, group, expert_parallel: bool):
        super().__init__()
        self.group, self.expert_parallel = group, expert_parallel
        self.gate, self.experts = moe.gate, moe.experts
        self.num_local = moe.experts.w13.shape[0]
        self.expert_start = 0
        if expert_parallel:
            self.expert_start = shard_experts_(moe.experts, rank, tp)
            self.num_local = moe.experts.w13.shape[0]
        self.shared_experts = shard_mlp(moe.shared_experts, rank, tp, group=None)

    def local_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Global expert ids [T, A] -> ids into this rank's stack; others' experts become -1."""
        local = ids - self.expert_start
        return local.masked_fill((local < 0) | (local >= self.num_local), -1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(h)  # every rank routes every token, identically
        shared = self.shared_experts(h)  # [T, D] partial sum over this rank's channels
        if not self.expert_parallel:
            dist.all_reduce(shared, group=self.group)
            return self.experts(h, ids, weights) + shared
        y = self.experts(h, self.local_ids(ids), weights) + shared
        dist.all_reduce(y, group=self.group)
        return y


def tp_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """What one rank's cache holds at TP degree ``tp`` (KDA state for H/tp heads)."""
    return shard_config(cfg, tp)


def apply_tp(model: GLM5Model, groups: ProcessGroups) -> GLM5Model:
    """Transform ``model`` in place into this rank's TP (and EP) shard; returns it."""
    if groups.info.tp_size == 1:
        check_layout(groups)
        return model
    full = model.cfg
    for block in (*model.layers, *([model.mtp] if model.mtp is not None else [])):
        shard_block(block, full, groups)
    model.cfg = tp_config(full, groups.info.tp_size)
    return model


def check_layout(groups: ProcessGroups) -> None:
    info = groups.info
    if info.ep_size not in (1, info.tp_size) or (info.ep_size > 1 and groups.ep is not groups.tp):
        raise ValueError(f"expert parallelism must be 1 or use the TP group itself: {info}")


def shard_block(block: nn.Module, full: ModelConfig, groups: ProcessGroups) -> None:
    """One decoder (or MTP) block of a model of config ``full``: its attention and its FFN."""
    check_layout(groups)
    info, group = groups.info, groups.tp
    rank, tp = info.tp_rank, info.tp_size
    attn = block.self_attn
    if isinstance(attn, KDAttention):
        shard = shard_kda(attn, full, rank, tp)
        shard.o_proj = _row_parallel(shard.o_proj, 0, shard.o_proj.in_features, group)
        block.self_attn = shard
    else:
        block.self_attn = shard_dsa(attn, full, rank, tp, group)
    if isinstance(block.mlp, MoE):
        block.mlp = TPMoE(block.mlp, rank, tp, group, info.ep_size > 1)
    else:
        block.mlp = shard_mlp(block.mlp, rank, tp, group)
