"""Notebook 07's figures: our emulated rank beside the reference deployment's published figures.

Lays out what ``glmlab.bench.reference_report.summarize`` holds: per-GPU output throughput
against the batch (with the published ladder's operating points and the goal), the speculative
cycle's phases (compute and modelled communication stacked) beside the published cycles, and
memory per pool. Computes nothing.
"""

from __future__ import annotations

import plotly.graph_objects as go

from glmlab.bench.reference_report import NAMES
from glmlab.bench.reference_rows import GOAL
from glmlab.trace.widgets.layout import finish

_COLORS = {"dflash2": "#1f77b4", "mtp": "#ff7f0e", "decode": "#2ca02c"}


def throughput_figure(summary: dict, title: str) -> go.Figure:
    fig = go.Figure()
    for algorithm, rows in summary["sweep"].items():
        fig.add_scatter(x=[r["batch"] for r in rows],
                        y=[r["per_gpu_output_tok_s"] for r in rows], mode="lines+markers",
                        name=f"glmlab {NAMES[algorithm]}", line={"color": _COLORS[algorithm]})
    ladder = summary["ladder"]
    fig.add_scatter(x=[p["batch"] for p in ladder], y=[p["per_gpu_output_tok_s"] for p in ladder],
                    mode="markers", marker={"symbol": "diamond", "size": 9, "color": "black"},
                    name="published ladder (per GPU)", text=[p["config"] for p in ladder])
    fig.add_scatter(x=[1, 132], y=[GOAL["per_gpu_output_tok_s"]] * 2, mode="lines",
                    line={"dash": "dot", "color": "gray"}, name="goal 3,007")
    fig.update_yaxes(type="log")
    return finish(fig, title, height=380, xaxis="running requests (batch)",
                  yaxis="output tok/s per GPU (log)")


def phases_figure(summary: dict, title: str) -> go.Figure:
    rows = summary["phases"]
    labels = [f"{r['config']}<br>{r['source']}" for r in rows]
    fig = go.Figure()
    for key, name in (("draft_ms", "draft"), ("verify_ms", "verify"),
                      ("rest_ms", "commit + rest"), ("comm_ms", "communication (modelled)")):
        fig.add_bar(x=labels, y=[r[key] or 0.0 for r in rows], name=name)
    fig.update_layout(barmode="stack")
    return finish(fig, title, height=380, xaxis="configuration and source", yaxis="ms per cycle")


def memory_figure(summary: dict, title: str) -> go.Figure:
    rows = [r for r in summary["memory"] if r["pool"] not in ("weights", "peak allocated")]
    fig = go.Figure()
    for key, name in (("emulated_run_gb", "this run (emulated rank)"),
                      ("glmlab_budget_gb", "glmlab budget, reference config"),
                      ("published_gb", "published, per GPU")):
        fig.add_bar(x=[r["pool"] for r in rows], y=[r[key] or 0.0 for r in rows], name=name)
    fig.update_layout(barmode="group")
    return finish(fig, title, height=360, xaxis="pool", yaxis="GB per GPU")
