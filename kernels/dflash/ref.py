"""The DFlash2 draft attention, as ``glmlab.speculative.dflash.DraftAttention.attend`` computes
it: a block of B queries per request attends to the request's context K/V (read from the draft KV
store at its token slots) and, non-causally, to the block's own B keys; softmax in fp32.

Shapes (kernels/README.md letters): N requests, B block rows, H query heads, HKV KV heads
(query head h reads KV head h // (H // HKV)), Dh head dim, S token slots, L context length.
"""

from __future__ import annotations

import torch


def gather_context(kv: torch.Tensor, kv_scale: torch.Tensor | None, slots: torch.Tensor,
                   dtype: torch.dtype) -> torch.Tensor:
    """kv [S, HKV, Dh] (bf16, or E4M3 with per-(slot, head) fp32 scales [S, HKV]) at slots [L]
    -> [L, HKV, Dh] in ``dtype``: what ``DraftKVStore.read`` returns."""
    if kv_scale is None:
        return kv[slots].to(dtype)
    return (kv[slots].float() * kv_scale[slots][..., None]).to(dtype)


def draft_attention_ref(q: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor,
                        kv_k: torch.Tensor, kv_v: torch.Tensor, ctx_slots: torch.Tensor,
                        ctx_lens: torch.Tensor, scale: float,
                        kv_k_scale: torch.Tensor | None = None,
                        kv_v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """q [N, B, H, Dh] (normed, rotated); k_blk, v_blk [N, B, HKV, Dh]; kv_k, kv_v [S, HKV, Dh];
    ctx_slots [N, Lmax] (entries at or beyond ctx_lens[i] are ignored); ctx_lens [N]
    -> o [N, B, H, Dh] in q.dtype. One request at a time, fp32 scores and softmax."""
    n, b, h, dh = q.shape
    g = h // k_blk.shape[2]
    out = []
    for i in range(n):
        slots = ctx_slots[i, :int(ctx_lens[i])].long()
        # the context is rounded to the compute dtype first, as the torch path's gather is
        keys = torch.cat([gather_context(kv_k, kv_k_scale, slots, q.dtype), k_blk[i]])
        vals = torch.cat([gather_context(kv_v, kv_v_scale, slots, q.dtype), v_blk[i]])
        keys = keys.float().repeat_interleave(g, dim=1)  # [L+B, H, Dh]: head h -> KV head h // g
        vals = vals.float().repeat_interleave(g, dim=1)
        s = torch.einsum("bhd,lhd->hbl", q[i].float(), keys) * scale
        out.append(torch.einsum("hbl,lhd->bhd", s.softmax(-1), vals))
    return torch.stack(out).to(q.dtype)
