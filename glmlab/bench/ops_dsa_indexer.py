"""The indexer part of the DSA benchmark (rows of ``glmlab.bench.ops_dsa``, op ``indexer``).

FP8 pool scores over 16384 pools (64K tokens) for a verify batch (requests of 8 rows), with
private contexts per request and with one prefix shared by every request, then top-512 + tail on
the kernel's scores. Rows: scores and top-k time, TFLOP/s, bytes/s of keys + scores against the
HBM copy rate measured in the same run, error against the torch reference on a few rows, and
whether the top-k equals ``select_ref`` on the same scores.
"""

from __future__ import annotations

import torch


def bench_indexer(rows: int, quick: bool, ceilings: dict, sink, time_us, describe_error,
                  num_pools: int = 16384, topk: int = 512, rows_per_request: int = 8) -> None:
    """FP8 pool scores + top-512 + tail over 64K tokens (16384 pools): private contexts per
    request of ``rows_per_request`` rows, and one prefix shared by every request."""
    from glmlab.kernels.dsa import indexer_triton as it
    from glmlab.kernels.dsa.ref import indexer_scores_fp8_ref, quantize_pool_keys_ref, select_ref

    g = torch.Generator(device="cuda").manual_seed(1)
    requests = -(-rows // rows_per_request)
    q = torch.randn(rows, 32, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(rows, 32, device="cuda", generator=g) * 32**-0.5
    pos = torch.full((rows,), num_pools * 4 + 2, device="cuda", dtype=torch.int32)
    row_req = (torch.arange(rows, device="cuda") // rows_per_request).to(torch.int32)
    for sharing in ("private", "shared-prefix"):
        stored = num_pools * (requests if sharing == "private" else 1)
        kf, ks = quantize_pool_keys_ref(torch.randn(stored, 128, device="cuda", generator=g))
        pool_slots = torch.arange(num_pools, device="cuda", dtype=torch.int32)[None, :] + (
            torch.arange(requests, device="cuda", dtype=torch.int32)[:, None] * num_pools
            if sharing == "private" else 0)
        pool_slots = pool_slots.expand(requests, num_pools).contiguous()
        base = {"op": "indexer", "rows": rows, "pools": num_pools, "index_heads": 32,
                "topk_pools": topk, "requests": requests, "sharing": sharing}
        try:
            fp8q = it.quantize_index_queries(q)
            pages = pool_slots[:, ::it.PAGE_POOLS].contiguous()
            scores_fn = lambda a=(fp8q, kf, ks, pages): it.pool_scores_fp8_paged(
                *a[0], a[1], a[2], w, pos, a[3], row_req, 4, 128**-0.5)
            scores = scores_fn()
            sel = it.select_topk_tokens(scores, pos, topk, 4, True)
            check = slice(0, 16)  # the reference scores a few rows (its [T, P] fp32 is big)
            qd = it.dequantize_index_queries(*fp8q)[check]
            ref = []
            for i in range(qd.shape[0]):  # keys of that row's request, dequantised in fp32
                slots = pool_slots[row_req[i]].long()
                keys = kf.view(torch.uint8)[slots].view(kf.dtype)  # byte gather: any torch
                ref.append(indexer_scores_fp8_ref(qd[i:i + 1], keys, ks[slots],
                                                  w[check][i:i + 1], 128**-0.5)[0])
            ref = torch.stack(ref)
            score_err = float((scores[check] - ref).norm() / ref.norm())
            same = all(sorted(a) == sorted(b) for a, b in zip(
                sel[check].tolist(), select_ref(scores[check], pos[check], topk, 4, True).tolist(),
                strict=True))
            scores_us = time_us(scores_fn, quick)
            topk_us = time_us(lambda s=scores: it.select_topk_tokens(s, pos, topk, 4, True),
                               quick)
        except Exception as e:
            sink.add({**base, "error": describe_error(e)})
            continue
        key_bytes = stored * (128 + 4)
        score_bytes = rows * num_pools * 4
        sink.add({**base, "scores_us": scores_us, "topk_us": topk_us,
                  "total_us": scores_us + topk_us, "score_rel_err_vs_ref": score_err,
                  "topk_same_as_ref_on_kernel_scores": same,
                  "score_tflops": 2.0 * rows * 32 * num_pools * 128 / scores_us / 1e6,
                  "scores_hbm_tbps": (key_bytes + score_bytes) / scores_us / 1e6,
                  "frac_hbm_scores": (key_bytes + score_bytes) / scores_us / 1e6
                  / ceilings["ceiling_hbm_tbps"],
                  "topk_hbm_tbps": score_bytes / topk_us / 1e6, **ceilings})
