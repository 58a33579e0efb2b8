"""Views of speculative decoding: cycle timelines (draft / verify / commit / rest per cycle, like
the reference deployment's Figure 3) with a cycles slider and a measured / reference-deployment
switch, the ms-per-accepted-token
cost model beside the reference deployment's, and the cost rows as a table.

Rows are ``glmlab.bench.spec`` rows (or ``cycle_rows`` of an engine trace): ``config``,
``per_cycle_ms`` [{phase: ms}], ``phase_ms``, ``cycle_ms``, ``accept_len``, ``simulated``.
"""

from __future__ import annotations

import ipywidgets as W
import plotly.graph_objects as go
from IPython.display import HTML
from plotly.subplots import make_subplots

from glmlab.speculative.costs import REFERENCE
from glmlab.trace.events import CycleEvent
from glmlab.trace.widgets.layout import control_layout, finish, show_figure, table

PHASE_COLORS = {"draft": "#e4572e", "verify": "#4c78a8", "commit": "#54a24b", "rest": "#b0b0b0"}
SPEC_PHASES = ("draft", "verify", "commit", "rest")


def _lane(row: dict) -> str:
    return row["config"] + (f" ({row['draft_kv_dtype']} KV)" if "draft_kv_dtype" in row else "")


def cycle_rows(cycles: list[CycleEvent], config: str) -> list[dict]:
    """An engine trace's speculative cycles as one timeline row (gaps between cycles = rest)."""
    per, last_end = [], None
    for c in cycles:
        ms = {name: (b - a) / 1e6 for name, a, b in c.phases}
        ms["rest"] = 0.0 if last_end is None else max(0.0, (c.start_ns - last_end) / 1e6)
        per.append(ms)
        last_end = c.end_ns
    lens = [n for c in cycles for n in c.commit_lens]
    phase_ms = {p: sum(m[p] for m in per) / max(1, len(per)) for p in SPEC_PHASES}
    return [{"config": config, "per_cycle_ms": per, "phase_ms": phase_ms,
             "cycle_ms": sum(phase_ms.values()), "accept_len": sum(lens) / max(1, len(lens)),
             "simulated": any(c.simulated for c in cycles)}]


def reference_cycle_rows(cycles: int = 4) -> list[dict]:
    """The reference deployment's Figure 3 means as timeline rows (its commit is inside "rest")."""
    out = []
    for name, c in REFERENCE.items():
        phases = {"draft": c.draft_ms, "verify": c.verify_ms, "commit": 0.0, "rest": c.rest_ms}
        out.append({"config": name, "per_cycle_ms": [phases] * cycles, "phase_ms": phases,
                    "accept_len": c.accept_len, "cycle_ms": c.cycle_ms})
    return out


def cycle_timeline_figure(rows: list[dict], cycles: int | None = None,
                          title: str = "Speculative cycles") -> go.Figure:
    """One lane per row, its cycles end to end, each split into draft / verify / commit / rest."""
    fig, shown = go.Figure(), set()
    for row in rows:
        lane, t = _lane(row), 0.0
        for i, cyc in enumerate(row["per_cycle_ms"][:cycles]):
            for p in SPEC_PHASES:
                if cyc.get(p, 0.0) <= 0:
                    continue
                fig.add_trace(go.Bar(
                    x=[cyc[p]], y=[lane], base=[t], orientation="h", name=p,
                    marker_color=PHASE_COLORS[p], legendgroup=p, showlegend=p not in shown,
                    hovertemplate=f"{lane}<br>cycle {i}: {p} %{{x:.2f}} ms<extra></extra>"))
                shown.add(p)
                t += cyc[p]
    fig.update_layout(barmode="overlay")
    sim = " [simulated acceptance]" if any(r.get("simulated") for r in rows) else ""
    return finish(fig, title + sim, height=120 + 45 * len(rows), xaxis="wall time (ms)",
                  yaxis="drafter")


def cycle_cost_figure(rows: list[dict]) -> go.Figure:
    """ms per accepted token split by phase: ours beside the reference's (independent scales)."""
    sim = " [simulated acceptance]" if any(r.get("simulated") for r in rows) else ""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("glmlab" + sim,
                                                          "reference deployment, 4 x H200"),
                        horizontal_spacing=0.14)
    for col, entries in ((1, rows), (2, reference_cycle_rows(1))):
        for p in SPEC_PHASES:
            fig.add_trace(go.Bar(
                x=[_lane(r) for r in entries],
                y=[r["phase_ms"][p] / r["accept_len"] for r in entries], name=p,
                marker_color=PHASE_COLORS[p], legendgroup=p, showlegend=col == 1,
                hovertemplate=f"{p}: %{{y:.3f}} ms per accepted token<extra></extra>"),
                row=1, col=col)
    fig.update_layout(barmode="stack")
    return finish(fig, "Cost per accepted token = cycle time / acceptance length", height=360,
                  xaxis="drafter", xaxis2="drafter", yaxis="ms per accepted token",
                  yaxis2="ms per accepted token")


def cost_table(rows: list[dict]) -> HTML:
    """``glmlab.speculative.costs.compare`` rows: the result (ms per token) first."""
    return table(rows, [("config", "config"), ("source", "source"),
                        ("ms_per_token", "ms per accepted token"), ("accept_len", "accept length"),
                        ("cycle_ms", "cycle ms"), ("draft_ms", "draft ms"),
                        ("verify_ms", "verify ms"), ("rest_ms", "rest ms")],
                 caption="Cycle cost model, ours beside the reference deployment's",
                 formats={"ms_per_token": "{:.2f}".format, "accept_len": "{:.2f}".format,
                          **{k: "{:.3f}".format for k in ("cycle_ms", "draft_ms", "verify_ms",
                                                          "rest_ms")}})


def acceptance_table(rows: list[dict]) -> HTML:
    """Measured acceptance (``glmlab.train.acceptance`` rows) beside the reference deployment's
    published lengths where it published one (MTP718, DFlash2-B8)."""
    shown = [{**r, "published": REFERENCE[r["config"]].accept_len if r["config"] in REFERENCE
              else None} for r in sorted(rows, key=lambda r: (r["algorithm"], r["verify_width"],
                                                               r["temperature"]))]
    return table(shown, [("config", "drafter"), ("temperature", "temperature"),
                         ("accept_len", "accepted per cycle"), ("published", "published"),
                         ("cycles", "cycles"), ("ms_per_accepted_token", "ms per token here")],
                 caption="Acceptance measured on the trained small model (test split), beside "
                         "the reference deployment's (GLM-5.3-Flash, its own data)",
                 formats={"accept_len": "{:.2f}".format,
                          "published": lambda v: "" if v is None else f"{v:.2f}",
                          "ms_per_accepted_token": "{:.1f}".format})


def cycle_explorer(rows: list[dict]) -> W.VBox:
    """Timeline with a cycles slider and a measured / reference-deployment switch."""
    most = max(len(r["per_cycle_ms"]) for r in rows)
    source = W.ToggleButtons(options=["measured", "published"], value="measured",
                             description="cycles from", **control_layout("auto"))
    cycles = W.IntSlider(value=min(4, most), min=1, max=most, description="cycles shown",
                         **control_layout("420px"))
    out = W.Output()

    def redraw(*_):
        reference = source.value == "published"
        show_figure(out, cycle_timeline_figure(
            reference_cycle_rows(cycles.value) if reference else rows, cycles.value,
            "Reference deployment Figure 3 (means, 4 x H200)" if reference
            else "Speculative cycles"))

    source.observe(redraw, "value")
    cycles.observe(redraw, "value")
    redraw()
    return W.VBox([source, cycles, out])
