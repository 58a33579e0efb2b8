"""DSA layer: multi-head latent attention without RoPE over the positions a k-pool indexer picks.

MLA (docs/model.md section 2.5), run in the absorbed form a server uses:
  q_lat = RMSNorm(W_qa h);  q = W_qb q_lat  -> [H, Dn]
  c     = RMSNorm(W_kva h)                  -> [R], the only per-token attention state cached
  q~_h  = W_UK[h]^T q_h;  o~_h = softmax_sel(q~_h . c_j / sqrt(Dn)) c_j;  o_h = W_UV[h] o~_h
  y     = W_o concat_h(o_h)
with W_UK, W_UV the two halves of each head's rows of ``kv_b_proj``.

Indexer: per-token keys and gate logits, compressed per complete 4-token pool when its last token
arrives (so a pool key is computed once and cached); the incomplete pool's rows wait in the
request's tail state. Queries score pools (kernels/dsa/ref.py), keep the top ``index_topk/kpool``
and the tail. When a sequence is no longer than ``index_topk`` every pool is kept, so selection is
exactly causal attention and scoring is skipped (the same set, computed without the scores).
Pool updates and selection are the ``dsa_index`` backend op: ``reference_index`` here (per
sequence), or on the triton backend the paged uniform-step indexer of ``glmlab.model.dsa_fast``.
"""

from __future__ import annotations

import torch
from torch import nn

from glmlab.cache.storage import ModelCache
from glmlab.config import ModelConfig
from glmlab.kernels.dsa.ref import indexer_scores_ref, pool_keys_ref, select_ref
from glmlab.model import torch_ops
from glmlab.model.layers import Linear, RMSNorm, merge_linears
from glmlab.model.plan import ForwardPlan


class Indexer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.dsa
        self.cfg = d
        self.wq_b = Linear(d.q_lora_rank, d.index_n_heads * d.index_head_dim)
        self.wk = Linear(cfg.hidden_size, d.index_head_dim)
        self.k_norm = nn.LayerNorm(d.index_head_dim, eps=1e-6)
        self.weights_proj = Linear(cfg.hidden_size, d.index_n_heads)
        self.index_kpool_compress_gate = nn.Parameter(
            torch.empty(d.index_head_dim, cfg.hidden_size))
        self.index_kpool_compress_ape = nn.Parameter(torch.empty(d.index_kpool, d.index_head_dim))
        self.h_proj = None  # wk | gate | weights_proj as one GEMM, set by fuse_projections

    def project(self, h: torch.Tensor, q_lat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per token: queries [T, HI, DI], keys [T, DI], gate logits [T, DI], weights [T, HI]."""
        d = self.cfg
        q = self.wq_b(q_lat).unflatten(-1, (d.index_n_heads, d.index_head_dim))
        if self.h_proj is not None:
            k, gate, w = self.h_proj(h).split([d.index_head_dim, d.index_head_dim,
                                               d.index_n_heads], dim=-1)
            k = self.k_norm(k)
        else:
            k = self.k_norm(self.wk(h))
            gate = h @ self.index_kpool_compress_gate.to(h.dtype).t()
            w = self.weights_proj(h)
        return q, k, gate, w.float() * d.index_n_heads**-0.5

    def fuse_projections(self) -> None:
        """wk | compress gate | weights_proj (all read h) as one GEMM, when their dtypes agree."""
        if self.h_proj is not None or self.wk.is_fp8 or self.weights_proj.is_fp8:
            return
        gate = self.index_kpool_compress_gate
        if gate.dtype != self.wk.weight.dtype:
            return
        as_linear = Linear(gate.shape[1], gate.shape[0])
        as_linear.weight = nn.Parameter(gate.data, requires_grad=False)
        merged = merge_linears([self.wk, as_linear, self.weights_proj])
        if merged is not None:
            self.index_kpool_compress_gate = as_linear.weight  # a view of the merged weight
            self.__dict__["h_proj"] = merged


class DSAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        d = cfg.dsa
        self.cfg, self.layer_idx = d, layer_idx
        self.q_a_proj = Linear(cfg.hidden_size, d.q_lora_rank)
        self.q_a_layernorm = RMSNorm(d.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = Linear(d.q_lora_rank, d.num_heads * d.qk_nope_head_dim)
        self.kv_a_proj_with_mqa = Linear(cfg.hidden_size, d.kv_lora_rank)
        self.kv_a_layernorm = RMSNorm(d.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = Linear(d.kv_lora_rank, d.num_heads * (d.qk_nope_head_dim + d.v_head_dim))
        self.o_proj = Linear(d.num_heads * d.v_head_dim, cfg.hidden_size)
        self.indexer = Indexer(cfg)
        self.attend = torch_ops.sparse_mla
        self.index = torch_ops.dsa_index  # the ``dsa_index`` backend op
        self.down_proj = None  # q_a|kv_a as one GEMM, set by fuse_projections
        self.fast_absorbed: tuple[torch.Tensor, torch.Tensor] | None = None  # prepare_step

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [H, Dn, R] and W_UV [H, Dv, R] in fp32."""
        d = self.cfg
        w = self.kv_b_proj.dense_weight(torch.float32)
        w = w.view(d.num_heads, d.qk_nope_head_dim + d.v_head_dim, d.kv_lora_rank)
        return w[:, : d.qk_nope_head_dim], w[:, d.qk_nope_head_dim:]

    def fuse_projections(self) -> None:
        """q_a|kv_a (both read h) as one GEMM, and the indexer's three projections of h."""
        if self.down_proj is None:
            self.__dict__["down_proj"] = merge_linears([self.q_a_proj, self.kv_a_proj_with_mqa])
        if self.down_proj is not None:
            self.down_proj.fp8_op = self.q_a_proj.fp8_op
        self.indexer.fuse_projections()

    def unfuse_projections(self) -> None:
        self.__dict__["down_proj"] = None
        self.indexer.__dict__["h_proj"] = None

    def prepare_step(self, fast: bool) -> None:
        """Fast path: W_UK and W_UV once, in the model dtype, laid out for batched matmuls."""
        if not fast:
            self.fast_absorbed = None
            return
        dtype = self.q_a_layernorm.weight.dtype
        w_uk, w_uv = self.absorbed_weights()
        self.fast_absorbed = (w_uk.to(dtype).contiguous(), w_uv.to(dtype).contiguous())

    def forward(self, h: torch.Tensor, plan: ForwardPlan, cache: ModelCache) -> torch.Tensor:
        d = self.cfg
        if self.down_proj is not None:
            qa, ca = self.down_proj(h).split([d.q_lora_rank, d.kv_lora_rank], dim=-1)
        else:
            qa, ca = self.q_a_proj(h), self.kv_a_proj_with_mqa(h)
        q_lat = self.q_a_layernorm(qa)  # [T, Rq]
        q = self.q_b_proj(q_lat).unflatten(-1, (d.num_heads, d.qk_nope_head_dim))  # [T, H, Dn]
        c = self.kv_a_layernorm(ca)  # [T, R]
        cache.write_latent(self.layer_idx, plan.write_slots, c)
        if self.fast_absorbed is None:
            w_uk, w_uv = self.absorbed_weights()
            q_abs = torch.einsum("thd,hdr->thr", q.float(), w_uk)  # [T, H, R]
        else:
            w_uk, w_uv = self.fast_absorbed
            q_abs = torch.einsum("thd,hdr->thr", q, w_uk)
        slot_indices = self.index(self, h, q_lat, plan, cache)  # [T, W] token slots, -1 padded
        o_lat = self.attend(q_abs, cache, self.layer_idx, slot_indices, d.softmax_scale)
        o = torch.einsum("thr,hvr->thv", o_lat.to(w_uv.dtype), w_uv)  # [T, H, Dv]
        return self.o_proj(o.flatten(1).to(h.dtype))

    def reference_index(self, h: torch.Tensor, q_lat: torch.Tensor, plan: ForwardPlan,
                        cache: ModelCache) -> torch.Tensor:
        """Per sequence: update its pools and tail, select its queries' positions -> slots."""
        iq, ik, igate, iw = self.indexer.project(h, q_lat)
        rows = []
        for i, (s, e) in enumerate(plan.token_ranges()):
            pos = self._select(i, plan, cache, iq[s:e], ik[s:e], igate[s:e], iw[s:e])
            rows.append(plan.context_slots[i][pos.clamp(min=0)].masked_fill(pos < 0, -1))
        return _pad_cat(rows)

    def _select(self, i: int, plan: ForwardPlan, cache: ModelCache, q, k, gate, w) -> torch.Tensor:
        """Update this sequence's pool keys and tail, then pick positions for each new token."""
        d = self.cfg
        start, n = plan.cache_lens[i], plan.seq_lens[i]
        num_pools = self.update_pools(i, plan, cache, k, gate)
        pos = torch.arange(start, start + n, device=q.device)
        if d.always_select_tail and start + n <= d.index_topk:
            ctx = torch.arange(start + n, device=q.device)
            return ctx[None, :].expand(n, -1).masked_fill(ctx[None, :] > pos[:, None], -1)
        pool_slots = plan.context_slots[i][: num_pools * d.index_kpool: d.index_kpool]
        keys = cache.read_pool_keys(self.layer_idx, pool_slots // d.index_kpool, k.dtype)
        scores = indexer_scores_ref(q, keys, w, d.index_head_dim**-0.5)
        return select_ref(scores, pos, d.topk_pools, d.index_kpool, d.always_select_tail)

    def update_pools(self, i, plan, cache, k, gate) -> int:
        """Compress the pools this step completes; keep the incomplete rest as the tail."""
        kp, layer = self.cfg.index_kpool, self.layer_idx
        start, n, slot = plan.cache_lens[i], plan.seq_lens[i], plan.state_slots[i]
        held = start % kp  # rows of the incomplete pool already in the tail
        tail = cache.index_tail[layer][slot]  # [kpool, 2*DI]
        rows = torch.cat([tail[:held].to(k.dtype), torch.cat([k, gate], dim=-1)])
        if plan.verify is not None:  # speculative verify: the commit rebuilds the tail from these
            plan.verify.record_index_rows(layer, slot, held, rows)
        done = (held + n) // kp
        if done:
            first_pool = (start - held) // kp
            dk = k.shape[-1]
            keys = pool_keys_ref(rows[: done * kp, :dk], rows[: done * kp, dk:],
                                 self.indexer.index_kpool_compress_ape)
            pos = torch.arange(first_pool, first_pool + done, device=k.device) * kp
            cache.write_pool_keys(layer, plan.context_slots[i][pos] // kp, keys)
        rest = rows[done * kp:]
        cache.index_tail[layer][slot, : rest.shape[0]] = rest.to(tail.dtype)
        return (start + n) // kp


def _pad_cat(rows: list[torch.Tensor]) -> torch.Tensor:
    width = max(r.shape[1] for r in rows)
    return torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[1]), value=-1) for r in rows])
