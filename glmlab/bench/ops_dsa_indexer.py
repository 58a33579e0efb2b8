"""The indexer part of the DSA benchmark (rows of ``glmlab.bench.ops_dsa``, op ``indexer``).

FP8 pool scores over 16384 pools (64K tokens) for a verify batch (requests of 8 rows), with
private contexts per request and with one prefix shared by every request, then top-512 + tail on
the kernel's scores; a decode batch (one row per request, private contexts) too. Each case runs
the current scores kernel (``ours``: ``pool_scores_fp8_paged``) and the round-2 kernel
(``previous``: ``pool_scores_fp8_paged_rowblock``). Rows: scores and top-k time, TFLOP/s, bytes/s
of keys + scores against the HBM copy rate measured in the same run, the fraction of the
roofline (the larger of bytes / HBM rate and FLOPs / FP8 matmul rate, over the time), error
against the torch reference on a few rows, and whether the top-k equals ``select_ref`` on the
same scores.
"""

from __future__ import annotations

import torch

CASES = (("private", 8), ("shared-prefix", 8), ("decode-private", 1))


def bench_indexer(rows: int, quick: bool, ceilings: dict, sink, time_us, describe_error,
                  num_pools: int = 16384, topk: int = 512) -> None:
    """FP8 pool scores + top-512 + tail over 64K tokens (16384 pools) for ``rows`` query rows:
    verify requests of 8 rows (private contexts / one shared prefix) and decode requests of one
    row (private contexts)."""
    from glmlab.kernels.dsa import indexer_triton as it

    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(rows, 32, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(rows, 32, device="cuda", generator=g) * 32**-0.5
    pos = torch.full((rows,), num_pools * 4 + 2, device="cuda", dtype=torch.int32)
    fp8q = it.quantize_index_queries(q)
    kernels = {"ours": it.pool_scores_fp8_paged, "previous": it.pool_scores_fp8_paged_rowblock}
    for sharing, rows_per_request in CASES:
        requests = -(-rows // rows_per_request)
        row_req = (torch.arange(rows, device="cuda") // rows_per_request).to(torch.int32)
        stored = num_pools * (1 if sharing == "shared-prefix" else requests)
        base = {"op": "indexer", "rows": rows, "pools": num_pools, "index_heads": 32,
                "topk_pools": topk, "requests": requests, "rows_per_request": rows_per_request,
                "sharing": sharing}
        try:
            kf, ks, pool_slots = _keys(stored, requests, num_pools, sharing, g)
            pages = pool_slots[:, ::it.PAGE_POOLS].contiguous()
        except Exception as e:
            sink.add({**base, "error": describe_error(e)})
            continue
        for variant, fn in kernels.items():
            if variant == "previous" and sharing == "decode-private":
                continue  # 8 requests per 64-row block: the round-2 kernel's worst case, slow
            try:
                hint = {"rows_per_program": rows_per_request} if variant == "ours" else {}
                row = _case(it, fn, fp8q, kf, ks, pages, pool_slots, w, pos, row_req, topk,
                            quick, time_us, hint)
            except Exception as e:
                sink.add({**base, "variant": variant, "error": describe_error(e)})
                continue
            key_bytes = stored * (128 + 4)
            score_bytes = rows * num_pools * 4
            flops = 2.0 * rows * 32 * num_pools * 128
            us = row["scores_us"]
            bound_us = max((key_bytes + score_bytes) / ceilings["ceiling_hbm_tbps"] / 1e6,
                           flops / ceilings["ceiling_fp8_tflops"] / 1e6)
            sink.add({**base, "variant": variant, **row,
                      "score_tflops": flops / us / 1e6,
                      "scores_hbm_tbps": (key_bytes + score_bytes) / us / 1e6,
                      "frac_hbm_scores": (key_bytes + score_bytes) / us / 1e6
                      / ceilings["ceiling_hbm_tbps"],
                      "frac_fp8_peak_scores": flops / us / 1e6 / ceilings["ceiling_fp8_tflops"],
                      "frac_roofline_scores": bound_us / us,
                      "topk_hbm_tbps": score_bytes / row["topk_us"] / 1e6, **ceilings})
        del kf, ks, pool_slots, pages
        torch.cuda.empty_cache()


def _keys(stored, requests, num_pools, sharing, g):
    from glmlab.kernels.dsa.ref import quantize_pool_keys_ref

    kf, ks = quantize_pool_keys_ref(torch.randn(stored, 128, device="cuda", generator=g))
    pool_slots = torch.arange(num_pools, device="cuda", dtype=torch.int32)[None, :] + (
        0 if sharing == "shared-prefix" else
        torch.arange(requests, device="cuda", dtype=torch.int32)[:, None] * num_pools)
    return kf, ks, pool_slots.expand(requests, num_pools).contiguous()


def _case(it, fn, fp8q, kf, ks, pages, pool_slots, w, pos, row_req, topk, quick, time_us, hint):
    from glmlab.kernels.dsa.ref import indexer_scores_fp8_ref, select_ref

    scores_fn = lambda: fn(*fp8q, kf, ks, w, pos, pages, row_req, 4, 128**-0.5, **hint)
    scores = scores_fn()
    sel = it.select_topk_tokens(scores, pos, topk, 4, True)
    check = torch.tensor([0, 7, 9, 500, scores.shape[0] - 1], device=scores.device)
    qd = it.dequantize_index_queries(*fp8q)[check]
    ref = []
    for i, r in enumerate(check.tolist()):  # keys of that row's request, dequantised in fp32
        slots = pool_slots[row_req[r]].long()
        keys = kf.view(torch.uint8)[slots].view(kf.dtype)  # byte gather: any torch
        ref.append(indexer_scores_fp8_ref(qd[i:i + 1], keys, ks[slots], w[r:r + 1],
                                          128**-0.5)[0])
    ref = torch.stack(ref)
    got = scores[check]
    same = all(sorted(a) == sorted(b) for a, b in zip(
        sel[check].tolist(), select_ref(got, pos[check], topk, 4, True).tolist(), strict=True))
    scores_us = time_us(scores_fn, quick)
    topk_us = time_us(lambda s=scores: it.select_topk_tokens(s, pos, topk, 4, True), quick)
    return {"scores_us": scores_us, "topk_us": topk_us, "total_us": scores_us + topk_us,
            "score_rel_err_vs_ref": float((got - ref).norm() / ref.norm()),
            "topk_same_as_ref_on_kernel_scores": same}
