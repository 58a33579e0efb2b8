"""Views of the kernel studies: block-FP8 MoE tuning (notebook 03: padding waste, tuned vs default
speedups, the tuning and benchmark tables, routed-expert time) and sparse MLA / indexer results
(notebook 04: result tables with the measured columns first, time and throughput by case).

Rows come from ``glmlab.kernels.moe.analysis`` and ``glmlab.bench.ops_dsa`` (the JSONL under
data/bench/); nothing here measures or derives a number.
"""

from __future__ import annotations

import plotly.graph_objects as go
from IPython.display import HTML

from glmlab.trace.widgets.layout import FigureSwitch, finish, fmt, table, tile_config
from glmlab.trace.widgets.layout import lines as lines  # re-exported for the notebooks

MACHINE_KEYS = ("gpu", "torch", "triton", "cuda", "date")


def machine(rows: list[dict]) -> str:
    """Where a set of benchmark rows was measured, for a caption."""
    r = rows[0] if rows else {}
    return ", ".join(f"{k} {r[k]}" for k in MACHINE_KEYS if r.get(k))


# ---------------------------------------------------------------- MoE (notebook 03)
def padding_waste_switch(tables: dict[int, list[dict]], block_ms: list[int]) -> FigureSwitch:
    """``{num_local_experts: analysis.padding_table(...)}``: one log-log figure per E."""
    figs = {}
    for e, rows in tables.items():
        fig = go.Figure()
        for bm in block_ms:
            for kind, dash in (("real", "solid"), ("uniform", "dot")):
                pts = [r for r in rows if r["block_m"] == bm and r["routes"] == kind]
                fig.add_scatter(x=[r["M"] for r in pts], y=[r["waste"] for r in pts],
                                line_dash=dash, name=f"BM={bm} {kind}")
        fig.update_layout(xaxis_type="log", yaxis_type="log")
        figs[f"E={e}"] = _finish(fig, f"Padded rows / real pairs - 1, {e} local experts",
                                 xaxis="M (tokens per step)",
                                 yaxis="waste (padded rows per real pair - 1)")
    return FigureSwitch(figs, "local experts")


def tune_table(rows: list[dict], num_experts: int) -> HTML:
    """``analysis.tune_table`` rows: speedups first, then times, then the tile configs."""
    rows = [{**r, "configs": f"up\u00a0{tile_config(r['up'])}\ndown\u00a0{tile_config(r['down'])}"}
            for r in rows]
    return table(rows, [
        ("M", "M (tokens)"), ("speedup_heldout", "speedup, held-out routes"),
        ("speedup_train", "speedup, train routes"), ("train_us", "tuned µs"),
        ("default_train_us", "default µs"), ("heldout_gap", "held-out gap"),
        ("numerics_relerr", "rel. error vs ref"), ("configs", "up / down GEMM config"),
        ("kept_default", "kept default")],
        caption=f"Tuning report, E={num_experts} (configs: block M/N/K, group, warps, stages)",
        formats={"kept_default": lambda v: "" if v is None else fmt(v)})


def moe_time_switch(tables: dict[int, list[dict]]) -> FigureSwitch:
    """``{E: analysis.bench_table(...)}``: tuned / default / torch times per M, log-log."""
    figs = {}
    for e, rows in tables.items():
        fig = go.Figure()
        for key, name in (("tuned_us", "Triton tuned"), ("default_us", "Triton default"),
                          ("torch_grouped_us", "torch grouped"), ("torch_loop_us", "torch loop")):
            fig.add_scatter(x=[r["M"] for r in rows], y=[r.get(key) for r in rows], name=name)
        fig.update_layout(xaxis_type="log", yaxis_type="log")
        figs[f"E={e}"] = _finish(fig, f"Routed-expert MoE time, E={e}", xaxis="M (tokens)",
                                 yaxis="time per MoE layer (µs, log)")
    return FigureSwitch(figs, "experts")


def tune_speedup_figure(tables: dict[int, list[dict]]) -> go.Figure:
    """``{E: analysis.tune_table(...)}``: tuned vs default speedup per M, training and held out."""
    fig = go.Figure()
    for e, rows in tables.items():
        for key, dash in (("speedup_train", "dot"), ("speedup_heldout", "solid")):
            fig.add_scatter(x=[r["M"] for r in rows], y=[r[key] for r in rows], line_dash=dash,
                            name=f"E={e} {key}", text=[f"{r['up']} / {r['down']}" for r in rows],
                            hovertemplate="M=%{x}: %{y:.3f}x<br>%{text}")
    fig.update_layout(xaxis_type="log")
    return _finish(fig, "Tuned vs default config (up + down GEMM time)", xaxis="M (tokens)",
                   yaxis="speedup")


def moe_bench_table(tables: dict[int, list[dict]], rows: list[dict]) -> HTML:
    """``{E: analysis.bench_table(...)}`` as one table: times and ratios, then roofline shares."""
    flat = [{"E": e, **r} for e, t in tables.items() for r in t]
    return table(flat, [
        ("E", "E"), ("M", "M (tokens)"), ("tuned_us", "tuned µs"),
        ("speedup_vs_default", "x default"), ("speedup_vs_torch_grouped", "x torch grouped"),
        ("weight_tbs", "weights TB/s"), ("tflops", "TFLOP/s"), ("frac_hbm", "share of HBM"),
        ("frac_fp8", "share of FP8 peak"), ("roofline_frac", "share of roofline")],
        caption=f"Routed-expert MoE benchmark ({machine(rows)})")


# ---------------------------------------------------------------- DSA (notebook 04)
def sparse_mla_table(results: list[dict]) -> HTML:
    mla = [r for r in results if r.get("op") == "sparse_mla"]
    # NOTE: the error column only when a variant failed: an all-blank column costs the width
    errors = [("error", "error")] if any(r.get("error") for r in mla) else []
    return table(mla, [
        ("rows", "rows"), ("heads", "heads"), ("layout", "layout"),
        ("variant", "variant"), ("config", "configuration"), ("kernel_us", "kernel µs"),
        ("tflops", "TFLOP/s"), ("gather_tbps", "gathered TB/s"),
        ("rel_err_vs_ref", "rel. error vs ref"), ("rule_pick", "rule's pick"), *errors],
        caption=f"Sparse MLA Partial + Combine by variant ({machine(mla)})")


def variant_speedup_table(rows: list[dict]) -> HTML:
    """``ops_dsa_views.variant_speedups`` rows: the rule's kernel against v1 and SGLang."""
    return table(rows, [
        ("rows", "rows"), ("heads", "heads"), ("layout", "layout"),
        ("rule_config", "rule's kernel"), ("rule_us", "rule µs"), ("rule_over_v1", "× v1"),
        ("rule_over_sglang", "× SGLang"), ("fastest", "fastest"),
        ("rule_now_same", "rule unchanged")],
        caption="Speed-up of the rule's pick (time of the other kernel / time of the rule's)")


def indexer_table(results: list[dict]) -> HTML:
    idx = [r for r in results if r.get("op") == "indexer"]
    return table(idx, [
        ("rows", "query rows"), ("total_us", "total µs"), ("scores_us", "scores µs"),
        ("topk_us", "top-k µs"), ("score_tflops", "score TFLOP/s"),
        ("topk_same_as_ref_on_kernel_scores", "same top-k as ref"),
        ("score_rel_err_vs_ref", "score rel. error"), ("pools", "pools"),
        ("index_heads", "index heads"), ("topk_pools", "top-k pools")],
        caption=f"FP8 indexer + top-k ({machine(idx)})")


def sparse_mla_figures(results: list[dict]) -> tuple[go.Figure, go.Figure]:
    """Kernel time and TFLOP/s by case and variant (ours: rule, v1, ws, pipelined-t256; SGLang's
    TileLang kernel); the bf16 matmul ceiling of the same run is a line on a log axis."""
    mla = [r for r in results if r.get("op") == "sparse_mla" and r.get("kernel_us")]
    time_fig, rate_fig = go.Figure(), go.Figure()
    for v in sorted({r["variant"] for r in mla}):
        sel = [r for r in mla if r["variant"] == v]
        labels = [f"M{r['rows']} H{r['heads']} {r['layout']}" for r in sel]
        time_fig.add_bar(name=v, x=labels, y=[r["kernel_us"] for r in sel])
        rate_fig.add_bar(name=v, x=labels, y=[r["tflops"] for r in sel])
    time_fig.update_layout(yaxis_type="log")
    rate_fig.update_layout(yaxis_type="log")
    if mla:
        ceiling = mla[0]["ceiling_bf16_tflops"]
        rate_fig.add_hline(y=ceiling, line_dash="dot",
                           annotation_text=f"bf16 matmul, same run: {ceiling:.0f} TFLOP/s",
                           annotation_position="bottom left")
    case = "case (M query rows, H heads, KV layout)"
    for fig in (time_fig, rate_fig):
        fig.update_layout(barmode="group", xaxis_tickangle=-60)
    return (_finish(time_fig, "Sparse MLA Partial + Combine time", xaxis=case,
                    yaxis="time (µs, log)", plot=420),
            _finish(rate_fig, "Sparse MLA throughput", xaxis=case, yaxis="TFLOP/s (log)",
                    plot=420))


def _finish(fig: go.Figure, title: str, plot: int = 340, **axes: str) -> go.Figure:
    fig = finish(fig, title, height=plot, **axes)
    if fig.layout.xaxis.tickangle:  # angled case labels need room under the axis
        fig.update_layout(margin_b=fig.layout.margin.b + 140, height=fig.layout.height + 140)
    return fig


def m1024_table(rows: list[dict]) -> HTML:
    """``analysis.m1024_comparison`` rows: our kernel-level gains beside the reference
    deployment's end-to-end ones."""
    return table(rows, [("gain", "gain"), ("what", "what"), ("conditions", "conditions")],
                 caption="M = 1024: tuned vs default", formats={"gain": lambda v: f"{v:+.2%}"})


def act_quant_table(bench: list[dict]) -> HTML:
    """The fused activation-quant rows of the MoE benchmark."""
    rows = [r for r in bench if r.get("op") == "act_quant"]
    return table(rows, [("variant", "variant"), ("us", "µs"), ("speedup_of_fused", "x fused"),
                        ("q_differ_vs_unfused_torch", "q bits differ from torch"),
                        ("scale_differ_vs_unfused_torch", "scale bits differ from torch")],
                 caption="Activation quantisation (per-token-group FP8)")
