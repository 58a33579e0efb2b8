"""The ``triton`` ``dsa_index``: a DSA layer's indexer on a uniform step, through the page table.

For a step in which every sequence brings the same n new tokens (``ForwardPlan.uniform_width``):
the indexer projections (fused where the dtypes allow), then ``kernels/decode/indexer_triton``:
``pool_update`` appends the new (key, gate) rows to each request's tail and compresses the pools
the step completes, ``index_select`` scores every complete pool of each query through the page
table and writes the token slots it attends to at the fixed width topk * kpool + kpool - 1. All
per-sequence lengths are read on the device from ``plan.positions``; buffers are sized by the page
table's width, so the step has no host synchronisation and a CUDA graph captured for a table
width serves any context up to it.

A speculative verify records, per request, the incomplete pool's held rows followed by the
window's rows (``VerifyRecorder.record_index_rows``), batched when the recorder offers
``record_index_rows_batched``. Any other step runs the layer's ``reference_index``.
"""

from __future__ import annotations

import torch

from glmlab.kernels.decode.indexer_triton import index_select, pool_update


def dsa_index(layer, h: torch.Tensor, q_lat: torch.Tensor, plan, cache) -> torch.Tensor:
    n = plan.uniform_width
    if not n or plan.positions is None or plan.page_table is None:
        return layer.reference_index(h, q_lat, plan, cache)
    d, idx = layer.cfg, layer.layer_idx
    q, k, gate, w = layer.indexer.project(h, q_lat)
    tail = cache.index_tail[idx]
    if plan.verify is not None:
        _record_rows(plan, idx, tail, k, gate, d.index_kpool, n)
    scales = cache.pool_key_scales.get(idx) if cache.keys_fp8 else None
    pool_update(k, gate, tail, cache.pool_keys[idx], scales,
                layer.indexer.index_kpool_compress_ape, plan.state_slots, plan.positions,
                plan.page_table, plan.page_size)
    return index_select(q, w, cache.pool_keys[idx], scales, plan.positions, plan.page_table,
                        plan.page_size, d.index_kpool, d.topk_pools, d.always_select_tail,
                        d.index_head_dim**-0.5, n)


def _record_rows(plan, layer: int, tail: torch.Tensor, k, gate, kpool: int, n: int) -> None:
    """rows [N, kpool-1+n, 2*DI]: tail rows 0..held-1, then the window's n rows, then padding."""
    slots = plan.state_slots
    n_seq = slots.shape[0]
    held = plan.positions.view(n_seq, n)[:, 0] % kpool  # [N]
    new = torch.cat([k, gate], dim=-1).view(n_seq, n, -1).to(tail.dtype)
    both = torch.cat([tail[slots][:, : kpool - 1], new], dim=1)  # [N, kpool-1+n, 2*DI]
    j = torch.arange(kpool - 1 + n, device=slots.device)[None, :]
    src = torch.where(j < held[:, None], j, (kpool - 1) + j - held[:, None]).clamp(
        max=kpool - 2 + n)
    rows = both.gather(1, src[..., None].expand(-1, -1, both.shape[2]))
    batched = getattr(plan.verify, "record_index_rows_batched", None)
    if batched is not None:
        batched(layer, slots, held, rows)
        return
    for i, (c, m) in enumerate(zip(plan.cache_lens, plan.seq_lens, strict=True)):
        h_i = c % kpool  # host lengths: eager verify only
        plan.verify.record_index_rows(layer, slots[i], h_i, rows[i, : h_i + m])
