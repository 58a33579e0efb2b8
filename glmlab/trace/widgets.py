"""Interactive views for notebooks: the memory-budget explorer and plotly figures of budgets,
slot accounting and pool occupancy over an engine trace; speculative cycle timelines (draft /
verify / commit per cycle, the seed's Figure 3) and the ms-per-accepted-token cost model.

The only module in glmlab that imports ipywidgets or plotly. Every number shown is computed by
``glmlab.cache.budget`` / the engine; this module only lays it out.
"""

from __future__ import annotations

import dataclasses
import html

import ipywidgets as W
import plotly.graph_objects as go
import torch
from IPython.display import HTML, display

from glmlab.cache.budget import GIB, Budget, BudgetError, BudgetInputs, plan_budget
from glmlab.cache.budget_report import budget_rows, seed_comparison_rows
from glmlab.cache.footprint import CacheFootprint
from glmlab.cache.storage import CacheDtypes
from glmlab.presets import preset_config
from glmlab.speculative.costs import SEED
from glmlab.trace.events import CycleEvent, StepEvent

_DT = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}


def table_html(rows: list[dict]) -> HTML:
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values())
                   + "</tr>" for r in rows)
    return HTML(f"<table><tr>{head}</tr>{body}</table>")


def seed_comparison() -> HTML:
    return table_html(seed_comparison_rows())


def budget_figure(b: Budget, title: str = "") -> go.Figure:
    """Where the pool bytes go (stacked bar, GiB) and the caps on running requests (bars)."""
    rows = [r for r in budget_rows(b) if r["gib"] > 0]
    fig = go.Figure([go.Bar(name=r["pool"], y=["pools (GiB)"], x=[r["gib"]], orientation="h",
                            text=f"{r['pool']}: {r['gib']:.2f}") for r in rows])
    fig.add_trace(go.Bar(y=[c.kind for c in b.caps], x=[c.value for c in b.caps], orientation="h",
                         name="caps", xaxis="x2", yaxis="y2", text=[c.reason for c in b.caps],
                         marker_color="grey"))
    fig.update_layout(barmode="stack", height=360, title=title or
                      f"max running requests {b.max_running_requests}",
                      yaxis={"domain": [0.6, 1.0]}, yaxis2={"domain": [0.0, 0.45], "anchor": "x2"},
                      xaxis2={"anchor": "y2", "type": "log", "title": "requests"})
    return fig


class BudgetExplorer:
    """Sliders for context length, KV / state dtypes, concurrency, TP, in-flight and speculative
    slots, shared prefix and the pool budget, over a model preset; shows the table and figure.
    ``set(**values)`` moves the controls from code (what a test or a script does)."""

    def __init__(self, model: str = "full", base: BudgetInputs | None = None):
        self.cfg = preset_config(model)
        self.base = base
        c = {
            "context_len": W.IntSlider(66_560, min=4_096, max=1_048_576, step=4_096,
                                       description="context"),
            "kv_dtype": W.Dropdown(options=["bf16", "fp8"], value="fp8", description="KV"),
            "state_dtype": W.Dropdown(options=["fp32", "bf16"], value="bf16",
                                      description="state"),
            "tp": W.Dropdown(options=[1, 2, 4, 8], value=4, description="TP"),
            "max_running_requests": W.IntSlider(132, min=1, max=1024, description="running"),
            "slots_per_request": W.IntSlider(1, min=1, max=4, description="slots/req"),
            "extra_slots": W.IntSlider(6, min=0, max=64, description="in flight"),
            "spec_slots": W.IntSlider(0, min=0, max=1024, description="spec slots"),
            "shared_prefix_len": W.IntSlider(65_472, min=0, max=1_048_576, step=64,
                                             description="shared"),
            "pool_gib": W.FloatSlider(33.33, min=1.0, max=120.0, step=0.01, description="GiB"),
        }
        self.controls, self.out, self.budget = c, W.Output(), None
        for w in c.values():
            w.observe(lambda _: self.update(), names="value")
        self.widget = W.VBox([W.HBox(list(c.values())[:5]), W.HBox(list(c.values())[5:]),
                              self.out])
        self.update()

    def set(self, **values) -> Budget | None:
        for k, v in values.items():
            self.controls[k].value = v
        return self.budget

    def inputs(self) -> BudgetInputs:
        v = {k: w.value for k, w in self.controls.items()}
        dtypes = CacheDtypes(latent=_DT[v["kv_dtype"]], pool_keys=torch.float8_e4m3fn,
                             recurrent=_DT[v["state_dtype"]])
        spec = CacheFootprint.of(self.cfg, dtypes, tp=v["tp"])
        if self.base is not None:  # keep e.g. the seed's draft-KV bytes
            draft = self.base.footprint.draft_bytes_per_token
            spec = dataclasses.replace(spec, draft_bytes_per_token=draft)
        return BudgetInputs(
            footprint=spec, context_len=v["context_len"], byte_budget=int(v["pool_gib"] * GIB),
            max_running_requests=v["max_running_requests"], extra_slots=v["extra_slots"],
            slots_per_request=v["slots_per_request"], spec_slots=v["spec_slots"],
            spec_bytes_per_slot=self.base.spec_bytes_per_slot if self.base else 0,
            shared_prefix_len=min(v["shared_prefix_len"], v["context_len"]), label="explorer")

    def update(self) -> None:
        with self.out:
            self.out.clear_output(wait=True)
            try:
                self.budget = plan_budget(self.inputs())
            except BudgetError as e:
                self.budget = None
                print(f"does not fit: {e}")
                return
            print(self.budget.table())
            display(budget_figure(self.budget))


def slot_accounting_figure(acct) -> go.Figure:
    """Measured token slots with and without the kv_only cache beside Lp + N x Ls / N x (Lp+Ls)."""
    names = ["kv_only cache", "no cache"]
    fig = go.Figure([
        go.Bar(name="measured", x=names, y=[acct.token_slots_shared, acct.token_slots_unshared]),
        go.Bar(name="Lp + N x Ls  /  N x (Lp + Ls)", x=names,
               y=[acct.expected_shared, acct.expected_unshared]),
    ])
    fig.update_layout(barmode="group", yaxis_title="token slots in use", height=320,
                      title=f"{acct.num_requests} requests, Lp={acct.prefix_len}, "
                            f"Ls={acct.suffix_len}, hit rate {acct.hit_rate:.0%}")
    return fig


def pool_occupancy_figure(steps: list[StepEvent]) -> go.Figure:
    """KV pages (used, held by the radix tree, evictable) and state slots per engine step."""
    x = [s.step for s in steps]
    p = [s.pool for s in steps]
    series = {"pages used": [u.pages_total - u.pages_free for u in p],
              "pages in tree": [u.pages_tree for u in p],
              "pages evictable": [u.pages_evictable for u in p],
              "state slots used": [u.slots_total - u.slots_free for u in p],
              "checkpoints": [u.checkpoints for u in p]}
    fig = go.Figure([go.Scatter(x=x, y=y, name=k, mode="lines") for k, y in series.items()])
    fig.add_trace(go.Bar(x=x, y=[s.num_seqs for s in steps], name="requests in step",
                         opacity=0.3, yaxis="y2"))
    fig.update_layout(xaxis_title="engine step", yaxis_title="pages / slots", height=360,
                      yaxis2={"overlaying": "y", "side": "right", "title": "requests"})
    return fig


# ---------------------------------------------------------------- speculative cycles
# Rows are ``glmlab.bench.spec`` rows (or ``cycle_rows`` of an engine trace): ``config``,
# ``per_cycle_ms`` [{phase: ms}], ``phase_ms``, ``cycle_ms``, ``accept_len``, ``simulated``.
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


def seed_cycle_rows(cycles: int = 4) -> list[dict]:
    """The seed's Figure 3 means as timeline rows (its commit is inside "rest")."""
    out = []
    for name, c in SEED.items():
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
    sim = " [simulated acceptance]" if any(r.get("simulated") for r in rows) else ""
    fig.update_layout(barmode="overlay", title=title + sim, xaxis_title="wall time (ms)",
                      height=140 + 60 * len(rows), margin=dict(l=10, r=10, t=50, b=40))
    return fig


def cycle_cost_figure(rows: list[dict]) -> go.Figure:
    """ms per accepted token split by phase: ours beside the seed's (independent scales)."""
    from plotly.subplots import make_subplots

    sim = " [simulated acceptance]" if any(r.get("simulated") for r in rows) else ""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("glmlab" + sim, "seed, 4 x H200"))
    for col, entries in ((1, rows), (2, seed_cycle_rows(1))):
        for p in SPEC_PHASES:
            fig.add_trace(go.Bar(
                x=[_lane(r) for r in entries],
                y=[r["phase_ms"][p] / r["accept_len"] for r in entries], name=p,
                marker_color=PHASE_COLORS[p], legendgroup=p, showlegend=col == 1,
                hovertemplate=f"{p}: %{{y:.3f}} ms per accepted token<extra></extra>"),
                row=1, col=col)
    fig.update_layout(barmode="stack", yaxis_title="ms per accepted token", height=380,
                      margin=dict(l=10, r=10, t=50, b=40))
    return fig


def cycle_explorer(rows: list[dict]) -> W.VBox:
    """Timeline with a cycles slider and a measured / seed toggle."""
    most = max(len(r["per_cycle_ms"]) for r in rows)
    source = W.ToggleButtons(options=["measured", "seed"], value="measured")
    cycles = W.IntSlider(value=min(4, most), min=1, max=most, description="cycles")
    fig = go.FigureWidget(cycle_timeline_figure(rows, cycles.value))

    def redraw(*_):
        seed = source.value == "seed"
        new = cycle_timeline_figure(seed_cycle_rows(cycles.value) if seed else rows,
                                    cycles.value, "Seed Figure 3 (means, 4 x H200)" if seed
                                    else "Speculative cycles")
        with fig.batch_update():
            fig.data = []
            fig.add_traces(list(new.data))
            fig.layout = new.layout

    source.observe(redraw, "value")
    cycles.observe(redraw, "value")
    return W.VBox([W.HBox([source, cycles]), fig])
