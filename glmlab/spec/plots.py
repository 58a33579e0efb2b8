"""Plotly figures and an ipywidgets explorer for speculative cycles (the seed's Figure 3, ours).

- ``timeline_figure``: one lane per drafter, its cycles laid end to end, each split into draft /
  verify / commit / rest, from ``glmlab.bench.spec`` rows (``per_cycle_ms``).
- ``cost_figure``: ms per accepted token split by phase, ours beside the seed's, with independent
  scales (a tiny CPU model and 4 x H200 differ by orders of magnitude; the shapes compare).
- ``cycle_explorer``: both, with a slider for the number of cycles shown and a toggle between our
  measurement and the seed's published means.

Only this module imports plotly and ipywidgets in ``glmlab.spec`` (the engine's ``glmlab.trace``
had no widget module when this was written); nothing here computes, it only draws rows.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from glmlab.spec.costs import SEED, CycleCost

COLORS = {"draft": "#e4572e", "verify": "#4c78a8", "commit": "#54a24b", "rest": "#b0b0b0"}
PHASES = ("draft", "verify", "commit", "rest")


def _label(row: dict) -> str:
    kv = f" ({row['draft_kv_dtype']} KV)" if "draft_kv_dtype" in row else ""
    return row["config"] + kv


def seed_rows(cycles: int = 4) -> list[dict]:
    """The seed's Figure 3 means as timeline rows (commit is inside rest there)."""
    out = []
    for name, c in SEED.items():
        phases = {"draft": c.draft_ms, "verify": c.verify_ms, "commit": 0.0, "rest": c.rest_ms}
        out.append({"config": name, "per_cycle_ms": [phases] * cycles, "accept_len": c.accept_len,
                    "cycle_ms": c.cycle_ms, "source": "seed"})
    return out


def timeline_figure(rows: list[dict], cycles: int | None = None,
                    title: str = "Speculative cycles") -> go.Figure:
    fig = go.Figure()
    shown = set()
    for row in rows:
        lane, t = _label(row), 0.0
        for i, cyc in enumerate(row["per_cycle_ms"][:cycles]):
            for p in PHASES:
                if cyc[p] <= 0:
                    continue
                fig.add_trace(go.Bar(
                    x=[cyc[p]], y=[lane], base=[t], orientation="h", name=p,
                    marker_color=COLORS[p], legendgroup=p, showlegend=p not in shown,
                    hovertemplate=f"{lane}<br>cycle {i}: {p} %{{x:.2f}} ms<extra></extra>"))
                shown.add(p)
                t += cyc[p]
    simulated = any(r.get("simulated") for r in rows)
    fig.update_layout(barmode="overlay", title=title + (" [simulated acceptance]" if simulated
                                                        else ""),
                      xaxis_title="wall time (ms)", height=140 + 60 * len(rows),
                      margin=dict(l=10, r=10, t=50, b=40))
    return fig


def cost_figure(rows: list[dict]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "glmlab (this run)" + (" [simulated acceptance]" if any(r.get("simulated") for r in rows)
                               else ""), "seed, 4 x H200"))
    ours = [(_label(r), CycleCost.of_row(r), r["phase_ms"]) for r in rows]
    seed = [(n, c, {"draft": c.draft_ms, "verify": c.verify_ms, "commit": 0.0, "rest": c.rest_ms})
            for n, c in SEED.items()]
    for col, entries in ((1, ours), (2, seed)):
        for p in PHASES:
            fig.add_trace(go.Bar(
                x=[n for n, _, _ in entries], y=[ph[p] / c.accept_len for _, c, ph in entries],
                name=p, marker_color=COLORS[p], legendgroup=p, showlegend=col == 1,
                hovertemplate=f"{p}: %{{y:.3f}} ms per accepted token<extra></extra>"),
                row=1, col=col)
    fig.update_layout(barmode="stack", yaxis_title="ms per accepted token", height=380,
                      margin=dict(l=10, r=10, t=50, b=40))
    return fig


def cycle_explorer(rows: list[dict]):
    """Timeline with a cycles slider and a measured / seed toggle (ipywidgets + FigureWidget)."""
    import ipywidgets as widgets

    most = max(len(r["per_cycle_ms"]) for r in rows)
    source = widgets.ToggleButtons(options=["measured", "seed"], value="measured")
    cycles = widgets.IntSlider(value=min(4, most), min=1, max=most, description="cycles")
    fig = go.FigureWidget(timeline_figure(rows, cycles.value))

    def redraw(*_):
        data = rows if source.value == "measured" else seed_rows(cycles.value)
        new = timeline_figure(data, cycles.value,
                              "Speculative cycles" if source.value == "measured"
                              else "Seed Figure 3 (means, 4 x H200)")
        with fig.batch_update():
            fig.data = []
            fig.add_traces(list(new.data))
            fig.layout = new.layout

    source.observe(redraw, "value")
    cycles.observe(redraw, "value")
    return widgets.VBox([widgets.HBox([source, cycles]), fig])
