"""Interleaved context-parallel prefill, applied to an unchanged single-device ``GLM5Model``.

``CPPrefill(model, groups)`` swaps each layer's attention and MoE for CP-aware wrappers around
the very same modules, then runs the model's own ``forward`` on this rank's token shard (rank r
holds tokens r, r+cp, ...; see ``interleave.py``). Everything per token (embedding, mHC, norms,
dense MLPs, the shared expert) runs on the shard as is. What needs other tokens communicates:

- DSA (``CPDSAttention``): latent KV rows and indexer keys of the shard are all-gathered into
  sequence order and written to this rank's cache (every rank keeps the full latent cache and
  pooled indexer keys, since a pool spans 4 consecutive tokens owned by 4 ranks); the rank's
  *queries* stay local and select and attend over the gathered context.
- KDA (``CPKDAttention``): the recurrence needs its sequence in order, so the layer input is
  gathered into sequence order, the layer runs over all tokens (for this rank's heads when
  ``tp = cp``, see ``kda_tp.py``) and the output goes back to the shards (a slice, or a
  reduce-scatter of the heads' partial sums).
- MoE (``ep_moe.EPMoE``) when ``ep = cp``: experts split over the group; BF16 or FP8-packet
  dispatch. With ``cp = 1`` (``ProcessGroups.single()``) this is the single-device model with the
  chosen MoE recipe, the reference the FP8 dispatch is compared with. ``ep = 1 < cp`` keeps
  every expert on every rank and the MoE runs on the shard without communication.

Chunked prefill works unchanged: each step is its own plan over the same caches. Steps must
bring at least ``cp`` tokens. The MTP layer is not transformed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from glmlab.cache.storage import CacheDtypes, ModelCache
from glmlab.distributed.ep_moe import EPMoE, MoEDispatch
from glmlab.distributed.fp8_packet import PacketKernels
from glmlab.distributed.interleave import CPComm, Interleave
from glmlab.distributed.kda_tp import shard_config, shard_kda
from glmlab.distributed.parallel import ProcessGroups
from glmlab.kernels.dsa.ref import indexer_scores_ref, select_ref
from glmlab.model.dsa import DSAttention
from glmlab.model.glm import GLM5Model
from glmlab.model.kda import KDAttention
from glmlab.model.moe import MoE
from glmlab.model.plan import ForwardPlan

SELECT_SCORES_BUDGET = 1 << 28  # fp32 indexer scores per selection chunk (1 GiB)


@dataclass(frozen=True)
class CPConfig:
    moe_dispatch: MoEDispatch = MoEDispatch.FP8_PACKET
    packet_kernels: PacketKernels = PacketKernels.TORCH

    def __post_init__(self) -> None:  # accept the enum values as plain strings (CLI flags)
        object.__setattr__(self, "moe_dispatch", MoEDispatch(self.moe_dispatch))
        object.__setattr__(self, "packet_kernels", PacketKernels(self.packet_kernels))


class CPKDAttention(nn.Module):
    """KDA over the whole sequence: gather to sequence order, run, scatter back to the shards."""

    def __init__(self, inner: KDAttention, comm: CPComm, head_parallel: bool):
        super().__init__()
        self.inner, self.comm, self.head_parallel = inner, comm, head_parallel

    def forward(self, h: torch.Tensor, plan: ForwardPlan, cache: ModelCache) -> torch.Tensor:
        ilv = self.comm.interleave(plan.num_tokens)
        y = self.inner(ilv.to_sequence(self.comm.all_gather(h)), plan, cache)  # [T, D]
        if self.head_parallel:  # partial sums over this rank's heads
            return self.comm.reduce_scatter(ilv.to_rank_major(y))
        return ilv.shard(y)


class CPDSAttention(nn.Module):
    """DSA with local queries over the all-gathered latent KV and indexer keys."""

    def __init__(self, inner: DSAttention, comm: CPComm):
        super().__init__()
        self.inner, self.comm = inner, comm

    def forward(self, h: torch.Tensor, plan: ForwardPlan, cache: ModelCache) -> torch.Tensor:
        m, d = self.inner, self.inner.cfg
        ilv = self.comm.interleave(plan.num_tokens)
        q_lat = m.q_a_layernorm(m.q_a_proj(h))  # [Tp, Rq]
        c = m.kv_a_layernorm(m.kv_a_proj_with_mqa(h))  # [Tp, R]
        iq, ik, igate, iw = m.indexer.project(h, q_lat)
        rows = ilv.to_sequence(self.comm.all_gather(torch.cat([c, ik, igate], dim=-1)))
        c_all, k_all, gate_all = rows.split([c.shape[-1], ik.shape[-1], igate.shape[-1]], -1)
        cache.write_latent(m.layer_idx, plan.write_slots, c_all)
        n = ilv.local_len
        q = m.q_b_proj(q_lat[:n]).unflatten(-1, (d.num_heads, d.qk_nope_head_dim))  # [n, H, Dn]
        w_uk, w_uv = m.absorbed_weights()
        q_abs = torch.einsum("thd,hdr->thr", q.float(), w_uk)  # [n, H, R]
        mine = ilv.local_rows(h.device)
        slots = []
        for i, (s, e) in enumerate(plan.token_ranges()):
            m.update_pools(i, plan, cache, k_all[s:e], gate_all[s:e])  # the layer's own update
            lo, hi = torch.searchsorted(mine, torch.tensor([s, e], device=h.device)).tolist()
            pos = mine[lo:hi] - s + plan.cache_lens[i]  # positions of this rank's queries
            sel = _select(m, i, plan, cache, iq[lo:hi], iw[lo:hi], pos, ik.dtype)
            slots.append(plan.context_slots[i][sel.clamp(min=0)].masked_fill(sel < 0, -1))
        o_lat = m.attend(q_abs, cache, m.layer_idx, _pad_cat(slots), d.softmax_scale)
        o = torch.einsum("thr,hvr->thv", o_lat, w_uv)  # [n, H, Dv]
        y = m.o_proj(o.flatten(1).to(h.dtype))
        return torch.cat([y, y.new_zeros(h.shape[0] - n, y.shape[1])])


def _select(m: DSAttention, i: int, plan: ForwardPlan, cache: ModelCache, q, w,
            pos: torch.Tensor, key_dtype: torch.dtype) -> torch.Tensor:
    """DSAttention's selection for queries at arbitrary positions ``pos`` of sequence ``i``
    (pools already updated for the whole step)."""
    d = m.cfg
    end = plan.cache_lens[i] + plan.seq_lens[i]
    if d.always_select_tail and end <= d.index_topk:  # short sequence: plain causal attention
        ctx = torch.arange(end, device=pos.device)
        return ctx[None, :].expand(pos.shape[0], -1).masked_fill(ctx[None, :] > pos[:, None], -1)
    num_pools = end // d.index_kpool
    pool_slots = plan.context_slots[i][: num_pools * d.index_kpool: d.index_kpool]
    keys = cache.read_pool_keys(m.layer_idx, pool_slots // d.index_kpool, key_dtype)
    # queries in chunks: the reference scores are [n, HI, P] fp32 (64K tokens: 16K queries x 32
    # heads x 16K pools would be 34 GB at once); selection is per query, so chunks change nothing
    step = max(1, SELECT_SCORES_BUDGET // max(1, keys.shape[0] * q.shape[1]))
    return torch.cat([select_ref(indexer_scores_ref(q[s:s + step], keys, w[s:s + step],
                                                    d.index_head_dim**-0.5),
                                 pos[s:s + step], d.topk_pools, d.index_kpool,
                                 d.always_select_tail)
                      for s in range(0, max(1, q.shape[0]), step)])


def _pad_cat(rows: list[torch.Tensor]) -> torch.Tensor:
    width = max(r.shape[1] for r in rows)
    return torch.cat([nn.functional.pad(r, (0, width - r.shape[1]), value=-1) for r in rows])


class CPPrefill:
    """A model transformed in place for interleaved CP on this rank, and how to run it."""

    def __init__(self, model: GLM5Model, groups: ProcessGroups, cfg: CPConfig | None = None,
                 wrap: bool = True):
        """``wrap=False``: leave the layers as they are (a caller that materialises the model
        layer by layer wraps each one with ``wrap_layer`` as it goes)."""
        info, self.cfg = groups.info, cfg or CPConfig()
        if info.tp_size not in (1, info.cp_size) or info.ep_size not in (1, info.cp_size):
            raise ValueError(f"CP prefill needs tp and ep to be 1 or the CP size: {info}")
        if groups.tp not in (None, groups.cp) or groups.ep not in (None, groups.cp):
            raise ValueError("tp and ep must use the CP group itself")
        self.model, self.info = model, info
        self.comm = CPComm(groups.cp, info.cp_size, info.cp_rank)
        self.config = shard_config(model.cfg, info.tp_size)  # what this rank's cache holds
        if wrap:
            for layer in model.layers:
                self.wrap_layer(layer)

    def wrap_layer(self, layer: nn.Module) -> None:
        """Swap one decoder layer's attention (and MoE, when ep = cp) for the CP wrappers."""
        info, tp = self.info, self.info.tp_size > 1
        attn = layer.self_attn
        if isinstance(attn, KDAttention):
            inner = shard_kda(attn, self.model.cfg, info.tp_rank, info.tp_size) if tp else attn
            layer.self_attn = CPKDAttention(inner, self.comm, head_parallel=tp)
        else:
            layer.self_attn = CPDSAttention(attn, self.comm)
        if isinstance(layer.mlp, MoE) and info.ep_size == info.cp_size:
            layer.mlp = EPMoE(layer.mlp, self.comm, self.cfg.moe_dispatch,
                              self.cfg.packet_kernels)

    def new_cache(self, num_token_slots: int, num_state_slots: int, page_size: int = 64,
                  dtypes: CacheDtypes | None = None) -> ModelCache:
        """This rank's cache: full latent and indexer rows, KDA state for its heads only."""
        device = self.model.embed_tokens.weight.device
        return ModelCache(self.config, num_token_slots, num_state_slots, page_size,
                          dtypes or CacheDtypes.like(self.model.dtype), device, with_mtp=False)

    def forward(self, input_ids: torch.Tensor, plan: ForwardPlan,
                cache: ModelCache) -> tuple[torch.Tensor, Interleave]:
        """input_ids [T] (the whole step, same on every rank) -> this rank's final hidden
        states [local_len, D] and the interleave that says which tokens they are."""
        ilv = self.comm.interleave(plan.num_tokens)
        hidden, _ = self.model(ilv.shard(input_ids), plan, cache)
        return hidden[: ilv.local_len], ilv

    def hidden(self, input_ids: torch.Tensor, plan: ForwardPlan,
               cache: ModelCache) -> torch.Tensor:
        """Final hidden states of the whole step [T, D] in sequence order, on every rank."""
        local, ilv = self.forward(input_ids, plan, cache)
        full = self.comm.all_gather(torch.cat([local, local.new_zeros(
            ilv.padded_len - local.shape[0], local.shape[1])]))
        return ilv.to_sequence(full)
