"""Training-mode attention: KDA and DSA over whole [B, T] windows, with autograd, no cache.

The serving layers (``glmlab.model.kda`` / ``dsa``) read and write a paged cache per step; a
training window instead starts from an empty state and sees all its T tokens at once. These
functions run the *same modules* (their projections, norms, gates and the registered KDA kernel)
in that layout, so a trained weight means exactly what the engine will compute with it
(tests/train/test_forward.py holds the two paths equal on the tiny and small configs).

- KDA: the causal short conv over the window from a zero state, then the ``kda_prefill`` backend
  over B sequences of T tokens (fla's ``chunk_kda``, which has a backward, on a GPU; the torch
  chunked reference, run as one [B, T] batch, on a CPU), then the gated output norm.
- DSA: absorbed MLA logits q~ . c over the window. Each query keeps what ``select_ref`` keeps at
  inference (the top ``index_topk / kpool`` complete pools by indexer score, plus the incomplete
  tail), or every causal position in ``dense`` mode. The indexer learns from its own loss: the KL
  divergence from the dense attention's pool distribution (softmax per head, averaged over heads,
  summed over each pool's 4 tokens, renormalised over the pools a query may select; detached) to
  the softmax of the indexer's pool scores, with the indexer's inputs detached. Selection is
  discrete, so the language-model loss never reaches the indexer and the KL never reaches the
  rest of the model (DeepSeek-V3.2's recipe, on pools).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glmlab.kernels.dsa.ref import candidate_mask, pool_keys_ref, select_ref
from glmlab.kernels.kda.ref import kda_chunk_ref, kda_gate_ref
from glmlab.model import torch_ops
from glmlab.model.dsa import DSAttention
from glmlab.model.kda import KDAttention


def kda_train(m: KDAttention, h: torch.Tensor) -> torch.Tensor:
    """h [B, T, D] -> [B, T, D], every window from a zero state."""
    k = m.cfg
    b, t, _ = h.shape
    qkv = torch.cat([m.q_proj(h), m.k_proj(h), m.v_proj(h)], dim=-1)  # [B, T, 3P]
    g = kda_gate_ref(m.f_b_proj(m.f_a_proj(h)), m.A_log, m.dt_bias, k.lower_bound)  # [B,T,H,K]
    beta = torch.sigmoid(m.b_proj(h))  # [B, T, H]
    w = m.conv_weight()  # [3P, W] fp32
    padded = F.pad(qkv.transpose(1, 2), (w.shape[1] - 1, 0)).to(w.dtype)  # zero conv state
    y = F.silu(F.conv1d(padded, w[:, None, :], groups=w.shape[0])).transpose(1, 2).to(qkv.dtype)
    q, kk, v = m._split_heads(y)  # [B, T, H, K] each; q, k normalised in fp32
    states = q.new_zeros(b, k.num_heads, k.head_dim, k.head_dim, dtype=torch.float32)
    if m.prefill_op is torch_ops.kda_prefill:  # equal windows: the reference takes them as a batch
        o, _ = kda_chunk_ref(q, kk, v, g, beta, states)
    else:
        cu = torch.arange(0, (b + 1) * t, t, device=h.device)
        o, _ = m.prefill_op(*(x.flatten(0, 1) for x in (q, kk, v, g, beta)), states, cu)
    gate = m.g_b_proj(m.g_a_proj(h)).unflatten(-1, (k.num_heads, k.head_dim))
    o = o.view(b, t, k.num_heads, k.head_dim).to(h.dtype)
    return m.o_proj(m._gated_norm(o, gate).flatten(2))


def dsa_train(m: DSAttention, h: torch.Tensor, dense: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """h [B, T, D] -> (output [B, T, D], indexer KL loss (scalar, fp32))."""
    d = m.cfg
    b, t, _ = h.shape
    if t % d.index_kpool:
        raise ValueError(f"training windows must be a multiple of index_kpool ({d.index_kpool})")
    q_lat = m.q_a_layernorm(m.q_a_proj(h))  # [B, T, Rq]
    q = m.q_b_proj(q_lat).unflatten(-1, (d.num_heads, d.qk_nope_head_dim))  # [B, T, H, Dn]
    c = m.kv_a_layernorm(m.kv_a_proj_with_mqa(h)).float()  # [B, T, R]
    w_uk, w_uv = m.absorbed_weights()
    q_abs = torch.einsum("bthd,hdr->bhtr", q.float(), w_uk)  # [B, H, T, R]
    logits = torch.einsum("bhtr,bsr->bhts", q_abs, c) * d.softmax_scale  # [B, H, T, T]
    causal = torch.ones(t, t, dtype=torch.bool, device=h.device).tril()
    scores = _pool_scores(m, h.detach(), q_lat.detach())  # [B, T, P] fp32, grads: indexer only
    keep = causal.expand(b, t, t) if dense else _selection_mask(scores, d, t)
    p = logits.masked_fill(~keep[:, None], float("-inf")).softmax(-1)
    o_lat = torch.einsum("bhts,bsr->bthr", p, c)
    o = torch.einsum("bthr,hvr->bthv", o_lat, w_uv)  # [B, T, H, Dv]
    out = m.o_proj(o.flatten(2).to(h.dtype))
    return out, _indexer_kl(logits.detach(), causal, scores, d.index_kpool)


def _pool_scores(m: DSAttention, h: torch.Tensor, q_lat: torch.Tensor) -> torch.Tensor:
    """Indexer scores of every query against every pool of its window: [B, T, P] fp32.

    ``indexer_scores_ref`` batched over windows (each window has its own pool keys).
    """
    d = m.cfg
    iq, ik, gate, iw = m.indexer.project(h, q_lat)
    b, t = h.shape[:2]
    keys = pool_keys_ref(ik.flatten(0, 1), gate.flatten(0, 1), m.indexer.index_kpool_compress_ape)
    keys = keys.view(b, t // d.index_kpool, -1)  # [B, P, DI]
    s = torch.einsum("bthd,bpd->bthp", iq.float(), keys.float()) * d.index_head_dim**-0.5
    return torch.einsum("bth,bthp->btp", iw.float(), torch.relu(s))


def _selection_mask(scores: torch.Tensor, d, t: int) -> torch.Tensor:
    """[B, T, T] bool: the positions each query attends to, exactly as ``select_ref`` picks
    (its rows are independent, so all windows go through it as one [B*T, P] batch)."""
    b = scores.shape[0]
    pos = torch.arange(t, device=scores.device).repeat(b)
    picked = select_ref(scores.detach().flatten(0, 1), pos, d.topk_pools, d.index_kpool,
                        d.always_select_tail)  # [B*T, W] positions, -1 padded
    keep = torch.zeros(b * t, t + 1, dtype=torch.bool, device=scores.device)
    keep.scatter_(1, picked.masked_fill(picked < 0, t), True)
    return keep[:, :t].view(b, t, t)


def _indexer_kl(logits: torch.Tensor, causal: torch.Tensor, scores: torch.Tensor,
                kpool: int) -> torch.Tensor:
    """Mean over queries with a candidate pool of KL(dense pool distribution || indexer)."""
    t = logits.shape[-1]
    cand = candidate_mask(torch.arange(t, device=logits.device), t // kpool, kpool)  # [T, P]
    rows = cand.any(-1)  # queries past the first complete pool
    cand = cand[rows]
    with torch.no_grad():
        attn = logits[:, :, rows].masked_fill(~causal[rows], float("-inf")).softmax(-1).mean(1)
        target = attn.unflatten(-1, (t // kpool, kpool)).sum(-1) * cand  # [B, T', P]
        target = target / target.sum(-1, keepdim=True).clamp(min=1e-30)
    log_q = scores[:, rows].masked_fill(~cand, float("-inf")).log_softmax(-1)
    kl = target * (target.clamp(min=1e-30).log() - log_q.masked_fill(~cand, 0.0))
    return kl.sum(-1).mean()
