"""DSA kernel benchmark and the notebook's views of it.

    python -m glmlab.bench.ops --op dsa [--rows 128,768,1024] [--heads 64,16] [--quick]

For each query-row count M, head count H (64 = one GPU, 16 = one TP4 rank) and KV layout (bf16,
raw FP8, scaled FP8), the sparse-MLA Partial + Combine kernels run over an index list of 2051
entries (2048 top-k tokens + 3 tail) padded with -1 to 2112, once per KV tile width (32, 128)
and head grouping (16 heads per CTA; 64 when H allows). Rows: kernel times (Partial, Combine,
both), TFLOP/s and bytes/s against ceilings measured in the same run (HBM copy, bf16 and fp8
matmul), the torch reference time, the error against that reference, and what
``choose_block`` would pick. The indexer (FP8 pool scores + top-512) gets one row per M.

Workload: requests of ``rows_per_request`` query rows (a verify block) over a private context of
``context`` tokens; a request's rows share one random index list (verify rows select nearly the
same pools), so a layer's unique KV is M/8 x 2051 rows, well past the 50 MB L2.

The notebook helpers at the end (selection recording on the tiny model, tables, figures) read
the JSONL this writes; they hold the logic so that notebooks/04_dsa_kernels.ipynb holds none.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from glmlab.kernels.dsa.dispatch import H200, GpuArch, choose_block, tile_iterations
from glmlab.kernels.dsa.layout import KVFormat, MlaKVLayout
from glmlab.kernels.dsa.ref import sparse_mla_ref

INDEX_WIDTH, PADDED_WIDTH, RANK, SCALE = 2051, 2112, 512, 256**-0.5


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmlab.bench.ops --op dsa")
    p.add_argument("--rows", default="128,768,1024")
    p.add_argument("--heads", default="64,16")
    p.add_argument("--layouts", default="bf16,fp8_raw,fp8_scaled")
    p.add_argument("--blocks", default="32,128")
    p.add_argument("--context", type=int, default=16384, help="tokens of context per request")
    p.add_argument("--rows-per-request", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="shorter timing loops")
    return p.parse_args(argv)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _time_us(fn, quick: bool) -> float:
    import triton.testing

    warm, rep = (5, 25) if quick else (25, 100)
    return float(triton.testing.do_bench(fn, warmup=warm, rep=rep, return_mode="median")) * 1e3


# ---------------------------------------------------------------------------------- ceilings
def measure_ceilings(quick: bool = False) -> dict:
    """HBM copy bandwidth (read + write) and dense bf16 / fp8 matmul rates, measured now."""
    n = 1 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(
        n, dtype=torch.uint8, device="cuda")
    src.random_(0, 255)
    copy_us = _time_us(lambda: dst.copy_(src), quick)
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    bf16_us = _time_us(lambda: a @ b, quick)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    fp8_us = _time_us(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), quick)
    flops = 2.0 * m**3
    return {"ceiling_hbm_tbps": 2 * n / copy_us / 1e6, "ceiling_bf16_tflops": flops / bf16_us / 1e6,
            "ceiling_fp8_tflops": flops / fp8_us / 1e6}


# ---------------------------------------------------------------------------------- workload
def make_workload(rows: int, heads: int, context: int, rows_per_request: int, seed: int = 0):
    """Queries [M, H, R], fp32 latent [N, R] and [M, 2112] slot indices (-1 past 2051)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    requests = -(-rows // rows_per_request)
    latent = torch.randn(requests * context, RANK, device="cuda", generator=g)
    picks = torch.rand(requests, context - 3, device="cuda", generator=g).argsort(dim=1)
    pos = torch.cat([picks[:, : INDEX_WIDTH - 3],
                     torch.arange(context - 3, context, device="cuda").expand(requests, 3)], 1)
    slots = pos + torch.arange(requests, device="cuda")[:, None] * context
    idx = torch.full((rows, PADDED_WIDTH), -1, dtype=torch.int32, device="cuda")
    idx[:, :INDEX_WIDTH] = slots.repeat_interleave(rows_per_request, 0)[:rows].to(torch.int32)
    q = torch.randn(rows, heads, RANK, device="cuda", generator=g)
    return q, latent, idx, requests


def torch_reference(q, kv, layout: MlaKVLayout, idx) -> torch.Tensor:
    """The torch path of the model's backend: gather, dequantise, ``sparse_mla_ref``, in chunks."""
    out, step = [], max(1, (1 << 25) // (idx.shape[1] * RANK))
    for s in range(0, q.shape[0], step):
        i = idx[s:s + step].long()
        rows = layout.unpack(kv[i.clamp(min=0).flatten()]).view(*i.shape, RANK)
        out.append(sparse_mla_ref(q[s:s + step], rows, i >= 0, SCALE))
    return torch.cat(out)


def _variants(heads: int, blocks: list[int]) -> list[tuple[int, int]]:
    groups = [16, 64] if heads % 64 == 0 else [16]
    return [(b, h) for b in blocks for h in groups]


def bench_sparse_mla(args, ceilings: dict, arch: GpuArch) -> list[dict]:
    from glmlab.kernels.dsa import sparse_mla_tilelang as sm

    layouts = [MlaKVLayout(KVFormat(x), RANK) for x in args.layouts.split(",")]
    jobs = [(lay, choose_block(arch, lay, m, h, block_i=b, heads_per_cta=g))
            for m in _ints(args.rows) for h in _ints(args.heads) for lay in layouts
            for b, g in _variants(h, _ints(args.blocks))]
    t0 = time.perf_counter()
    compiled = sm.precompile(jobs)
    print(f"compiled {compiled} kernels in {time.perf_counter() - t0:.1f} s", flush=True)
    rows_out = []
    for m in _ints(args.rows):
        for h in _ints(args.heads):
            q, latent, idx, requests = make_workload(m, h, args.context, args.rows_per_request)
            for lay in layouts:
                kv = lay.pack(latent)
                ref = torch_reference(q, kv, lay, idx)
                ref_us = _time_us(lambda a=(q, kv, lay, idx): torch_reference(*a), True)
                rule = choose_block(arch, lay, m, h)
                for b, g in _variants(h, _ints(args.blocks)):
                    cfg = choose_block(arch, lay, m, h, block_i=b, heads_per_cta=g)
                    rows_out.append(_one_case(sm, q, kv, lay, idx, cfg, rule, ref, ref_us,
                                              requests, ceilings, args.quick))
                    print(_fmt(rows_out[-1]), flush=True)
                del kv
            del q, latent, idx
            torch.cuda.empty_cache()
    return rows_out


def _one_case(sm, q, kv, lay, idx, cfg, rule, ref, ref_us, requests, ceilings, quick) -> dict:
    m, h, _ = q.shape
    out, _ = sm.sparse_mla_fwd(q, kv, lay, idx, SCALE, cfg)
    err = float((out - ref).norm() / ref.norm())
    partial_us = _time_us(lambda: sm.sparse_mla_partial(q, kv, lay, idx, SCALE, cfg), quick)
    po, pl = sm.sparse_mla_partial(q, kv, lay, idx, SCALE, cfg)
    combine_us = _time_us(lambda: sm.sparse_mla_combine(po, pl), quick) if cfg.num_splits > 1 \
        else 0.0
    total_us = _time_us(lambda: sm.sparse_mla_fwd(q, kv, lay, idx, SCALE, cfg), quick)
    flops = 4.0 * m * h * INDEX_WIDTH * RANK
    hbm = requests * INDEX_WIDTH * lay.bytes_per_token + idx.numel() * 4 + m * h * RANK * (4 + 4)
    gathered = m * -(-h // cfg.heads_per_cta) * INDEX_WIDTH * lay.bytes_per_token
    return {
        "op": "sparse_mla", "rows": m, "heads": h, "layout": lay.format.value,
        "index_width": INDEX_WIDTH, "padded_width": PADDED_WIDTH, "block_i": cfg.block_i,
        "heads_per_cta": cfg.heads_per_cta, "splits": cfg.num_splits,
        "tile_iterations": tile_iterations(PADDED_WIDTH, cfg.block_i),
        "rule_pick": cfg == rule, "rule": rule.describe(),
        "partial_us": partial_us, "combine_us": combine_us, "total_us": total_us,
        "torch_ref_us": ref_us, "speedup_vs_torch": ref_us / total_us, "rel_err_vs_ref": err,
        "tflops": flops / total_us / 1e6, "hbm_tbps": hbm / total_us / 1e6,
        "gather_tbps": gathered / total_us / 1e6,
        "frac_bf16_peak": flops / total_us / 1e6 / ceilings["ceiling_bf16_tflops"],
        "frac_hbm": hbm / total_us / 1e6 / ceilings["ceiling_hbm_tbps"], **ceilings,
    }


def _fmt(r: dict) -> str:
    return (f"M={r['rows']:5d} H={r['heads']:2d} {r['layout']:10s} block={r['block_i']:3d} "
            f"hpc={r['heads_per_cta']:2d} splits={r['splits']:2d} partial={r['partial_us']:8.1f}us "
            f"total={r['total_us']:8.1f}us {r['tflops']:6.1f} TF/s {r['hbm_tbps']:5.2f} TB/s "
            f"torch={r['torch_ref_us']:9.1f}us err={r['rel_err_vs_ref']:.2e}"
            f"{'  <- rule' if r['rule_pick'] else ''}")


def bench_indexer(rows: int, quick: bool, num_pools: int = 16384, topk: int = 512) -> dict:
    """FP8 pool scores + top-512 for ``rows`` queries over 64K tokens (16384 pools)."""
    from glmlab.kernels.dsa import indexer_triton as it
    from glmlab.kernels.dsa.ref import indexer_scores_fp8_ref, quantize_pool_keys_ref, select_ref

    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(rows, 32, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    kf, ks = quantize_pool_keys_ref(torch.randn(num_pools, 128, device="cuda", generator=g))
    w = torch.randn(rows, 32, device="cuda", generator=g) * 32**-0.5
    pos = torch.full((rows,), num_pools * 4 + 2, device="cuda")
    kernel = lambda: it.indexer_select_fp8(q, kf, ks, w, pos, topk, 4, 128**-0.5)
    ref = lambda: select_ref(indexer_scores_fp8_ref(q, kf, ks, w, 128**-0.5), pos, topk, 4, True)
    same = all(sorted(a) == sorted(b) for a, b in zip(kernel().tolist(), ref().tolist(),
                                                      strict=True))
    scores_us = _time_us(lambda: it.pool_scores_fp8(q, kf, ks, w, pos, 4, 128**-0.5), quick)
    return {"op": "indexer", "rows": rows, "pools": num_pools, "index_heads": 32,
            "topk_pools": topk, "scores_us": scores_us, "total_us": _time_us(kernel, quick),
            "torch_ref_us": _time_us(ref, True), "same_selection_as_ref": same,
            "score_tflops": 2.0 * rows * 32 * num_pools * 128 / scores_us / 1e6}


def run(argv: list[str]) -> list[dict]:
    args = _args(argv)
    arch = GpuArch.current()
    ceilings = measure_ceilings(args.quick)
    print("ceilings:", {k: round(v, 2) for k, v in ceilings.items()}, flush=True)
    rows = bench_sparse_mla(args, ceilings, arch)
    for m in _ints(args.rows):
        rows.append(bench_indexer(m, args.quick))
        print(rows[-1], flush=True)
    return rows


# ------------------------------------------------------------------- notebook helpers (CPU)
def record_tiny_selection(prompt_len: int = 80, seed: int = 0) -> torch.Tensor:
    """Positions [T, W] the tiny model's DSA layer attends to during one prefill (-1 padded).

    Wraps the layer's bound SPARSE_MLA op with a recorder; the tiny session's sequence 0 owns
    slots 0..max_len-1, so slots are positions.
    """
    from glmlab import presets
    from glmlab.checkpoint.writer import init_random_
    from glmlab.config import ModelConfig
    from glmlab.model.dsa import DSAttention
    from glmlab.model.glm import GLM5Model
    from glmlab.model.session import Session
    from glmlab.testing.parity import prompt_ids

    model = init_random_(GLM5Model(ModelConfig.from_hf(presets.tiny()), with_mtp=False), seed)
    seen: list[torch.Tensor] = []

    def recording(op):
        def attend(q, cache, layer, slot_indices, scale):
            seen.append(slot_indices.clone())
            return op(q, cache, layer, slot_indices, scale)
        return attend

    for mod in model.modules():
        if isinstance(mod, DSAttention):
            mod.attend = recording(mod.attend)
    Session(model, max_len=prompt_len).forward({0: prompt_ids(prompt_len, seed)})
    return seen[0]


def seed_iteration_table(widths=(2051, 2112), blocks=(32, 64, 128)) -> list[dict]:
    return [{"index_width": w, "block_i": b, "tile_iterations": tile_iterations(w, b),
             "virtual_pad": tile_iterations(w, b) * b - w} for w in widths for b in blocks]


def rule_table(rows=(1, 16, 128, 768, 1024), heads=(16, 64), arch: GpuArch = H200) -> list[dict]:
    out = []
    for fmt in KVFormat:
        for m in rows:
            for h in heads:
                cfg = choose_block(arch, MlaKVLayout(fmt, RANK), m, h)
                out.append({"layout": fmt.value, "rows": m, "heads": h, "config": cfg.describe()})
    return out


RESULTS = Path(__file__).resolve().parents[2] / "data" / "bench" / "dsa.jsonl"
TIMING = {"warmup": "do_bench 25 ms (5 --quick)", "repetitions": "do_bench 100 ms (25), median"}


def load_results(path: str | Path = RESULTS) -> list[dict]:
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines() if line] if p.exists() else []


def block_speedups(results: list[dict]) -> list[dict]:
    """Block 32 vs 128 at the same rows, heads, layout and head grouping (the seed's 1.12x)."""
    mla = [r for r in results if r.get("op") == "sparse_mla"]
    key = lambda r: (r["rows"], r["heads"], r["layout"], r["heads_per_cta"])
    by = {(key(r), r["block_i"]): r for r in mla}
    out = []
    for (k, b), r in sorted(by.items()):
        if b == 32 and (k, 128) in by:
            r128 = by[(k, 128)]
            now = choose_block(H200, MlaKVLayout(KVFormat(k[2]), RANK), k[0], k[1])
            out.append({"rows": k[0], "heads": k[1], "layout": k[2], "heads_per_cta": k[3],
                        "block32_us": r["total_us"], "block128_us": r128["total_us"],
                        "speedup_128_over_32": r["total_us"] / r128["total_us"],
                        "rule_now": f"{now.block_i}x{now.heads_per_cta}"})
    return out


def figures(results: list[dict]):
    """Plotly figures: Partial+Combine time by block width, and TFLOP/s against the ceiling."""
    import plotly.graph_objects as go

    mla = [r for r in results if r.get("op") == "sparse_mla"]
    time_fig, rate_fig = go.Figure(), go.Figure()
    for b in sorted({r["block_i"] for r in mla}):
        sel = [r for r in mla if r["block_i"] == b]
        labels = [f"M{r['rows']} H{r['heads']} {r['layout']} g{r['heads_per_cta']}" for r in sel]
        time_fig.add_bar(name=f"block {b}", x=labels, y=[r["total_us"] for r in sel])
        rate_fig.add_bar(name=f"block {b}", x=labels, y=[r["tflops"] for r in sel])
    if mla:
        rate_fig.add_hline(y=mla[0]["ceiling_bf16_tflops"], annotation_text="bf16 matmul, same run")
    time_fig.update_layout(title="sparse MLA Partial + Combine (us)", barmode="group")
    rate_fig.update_layout(title="sparse MLA TFLOP/s", barmode="group")
    return time_fig, rate_fig


def selection_figure(selected: torch.Tensor, kpool: int = 4):
    """Heatmap query x pool: 1 = selected by top-k, 0.5 = the query's own tail, 0 = not read."""
    import plotly.graph_objects as go

    t_len = selected.shape[0]
    num_pools = -(-t_len // kpool)
    grid = torch.zeros(t_len, num_pools)
    for t, row in enumerate(selected.tolist()):
        for pos in row:
            if pos >= 0:
                tail = pos // kpool == t // kpool and (t + 1) % kpool != 0
                grid[t, pos // kpool] = max(grid[t, pos // kpool], 0.5 if tail else 1.0)
    fig = go.Figure(go.Heatmap(z=grid.tolist(), colorscale="Blues", showscale=False))
    fig.update_layout(title="pools each query reads (tiny model, one prefill)",
                      xaxis_title="pool (4 tokens)", yaxis_title="query position", height=500)
    return fig


def markdown_table(rows: list[dict], digits: int = 3) -> str:
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    fmt = lambda v: (f"{v:.1f}" if abs(v) >= 10 else f"{v:.{digits}g}") if isinstance(v, float) \
        else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def reference_check(width: int = 2051, heads: int = 16, seed: int = 0) -> list[dict]:
    """On CPU: the kernels' split form (Partial per split + Combine) vs one-shot sparse MLA."""
    from glmlab.kernels.dsa.ref import (
        sparse_mla_combine_ref,
        sparse_mla_partial_ref,
        split_bounds,
    )

    g = torch.Generator().manual_seed(seed)
    q, cache = torch.randn(4, heads, 64, generator=g), torch.randn(4096, 64, generator=g)
    idx = torch.randint(0, 4096, (4, width), generator=g)
    idx[:, -40:] = -1
    rows, valid = cache[idx.clamp(min=0)], idx >= 0
    one_shot = sparse_mla_ref(q, rows, valid, SCALE)
    out = []
    for block, splits in ((32, 1), (128, 1), (32, 4), (128, 3)):
        po, pl = sparse_mla_partial_ref(q, rows, valid, SCALE, block, splits)
        merged = sparse_mla_combine_ref(po, pl)[0]
        out.append({"block_i": block, "splits": splits, "tiles": tile_iterations(width, block),
                    "split_columns": split_bounds(width, block, splits),
                    "max_abs_diff": float((merged - one_shot).abs().max())})
    return out
