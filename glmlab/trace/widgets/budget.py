"""Views of the memory budget: the reference deployment comparison, a budget as tables and a
figure, the budget
explorer (controls over context, dtypes, concurrency, TP, slots, prefix and pool size), slot
accounting with and without prefix sharing, and pool occupancy over an engine trace.

Every number shown is computed by ``glmlab.cache.budget`` / the engine; this module lays it out.
"""

from __future__ import annotations

import dataclasses

import ipywidgets as W
import plotly.graph_objects as go
import torch
from IPython.display import HTML, display
from plotly.subplots import make_subplots

from glmlab.cache import budget_report
from glmlab.cache.budget import GIB, Budget, BudgetError, BudgetInputs, plan_budget
from glmlab.cache.footprint import CacheFootprint
from glmlab.cache.storage import CacheDtypes
from glmlab.presets import preset_config
from glmlab.speculative.memory import spec_state_bytes
from glmlab.trace.events import StepEvent
from glmlab.trace.widgets.layout import control_layout, finish, grid, table

_DT = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}
VERIFY_WIDTH = 8  # the speculative slots' ReplaySSM ring covers one verify window of 8 tokens


def reference_comparison() -> HTML:
    return table(budget_report.reference_comparison_rows(), [
        ("config", "config"), ("pool", "pool"), ("reference", "published GiB"),
        ("glmlab", "glmlab GiB (derived)"), ("max_running", "max running requests")],
        caption="Per GPU, TP4 decode: the reference deployment vs glmlab's derivation")


def budget_view(b: Budget) -> HTML:
    """One budget as two tables: where the pool bytes go, and every cap on running requests."""
    x, s = b.inputs, b.inputs.footprint
    pools = budget_report.budget_rows(b) + [{"pool": "total", "per_unit": "", "units": "",
                               "gib": b.pool_bytes / GIB}]
    binding = " = ".join(c.kind for c in b.binding)
    head = (f"memory budget{' (' + x.label + ')' if x.label else ''}: {s.formats}; "
            f"context {x.context_len:,}, page {x.page_size}")
    caps = [{"cap": c.kind, "requests": c.value, "reason": c.reason} for c in b.caps]
    note = ("<p>note: more running requests than full-context KV holds; decode may preempt "
            "(and recompute) when pages run out</p>") if b.overcommitted else ""
    pool_t = table(pools, [("pool", "pool"), ("per_unit", "per unit"), ("units", "units"),
                           ("gib", "GiB")], caption=head, formats={"gib": lambda v: f"{v:.2f}"})
    cap_t = table(caps, [("cap", "cap"), ("requests", "requests"), ("reason", "reason")],
                  caption=f"max running requests: {b.max_running_requests} ({binding})")
    return HTML(pool_t.data + cap_t.data + note)


def budget_figure(b: Budget, title: str = "") -> go.Figure:
    """Where the pool bytes go (stacked bar, GiB) and the caps on running requests (log bars)."""
    fig = make_subplots(rows=2, cols=1, row_heights=[0.35, 0.65], vertical_spacing=0.22)
    for r in (r for r in budget_report.budget_rows(b) if r["gib"] > 0):
        fig.add_trace(go.Bar(name=r["pool"], y=["pools"], x=[r["gib"]], orientation="h",
                             hovertemplate=f"{r['pool']}: %{{x:.2f}} GiB<extra></extra>"),
                      row=1, col=1)
    fig.add_trace(go.Bar(y=[c.kind for c in b.caps], x=[c.value for c in b.caps],
                         orientation="h", name="caps", marker_color="grey", showlegend=False,
                         text=[f"{c.value:,}" for c in b.caps], textposition="auto",
                         hovertext=[c.reason for c in b.caps]), row=2, col=1)
    fig.update_layout(barmode="stack")
    fig.update_xaxes(type="log", row=2, col=1)
    binding = " = ".join(c.kind for c in b.binding)
    return finish(fig, title or f"max running requests {b.max_running_requests} ({binding})",
                  height=330, xaxis="pool bytes per GPU (GiB)", yaxis="pool",
                  xaxis2="max running requests (log scale)", yaxis2="cap")


class BudgetExplorer:
    """Controls for context length, KV / state dtypes, TP, concurrency, state and speculative
    slots, shared prefix and the pool budget, over a model preset; shows the tables and figure.
    ``set(**values)`` moves the controls from code (what a test or a script does)."""

    def __init__(self, model: str = "full", base: BudgetInputs | None = None):
        self.cfg = preset_config(model)
        self.base = base
        # NOTE: width "auto" lets each control fill its grid cell; "100%" adds the widget's
        # own margins on top and sticks out of the output area
        wide = control_layout("auto")
        buttons = {**wide, "style": {**wide["style"], "button_width": "64px"}}
        tokens = {"readout_format": ",", **wide}
        c = {
            "context_len": W.IntSlider(66_560, min=4_096, max=1_048_576, step=1_024,
                                       description="context (tokens)", **tokens),
            "shared_prefix_len": W.IntSlider(65_472, min=0, max=1_048_576, step=64,
                                             description="shared prefix (tokens)", **tokens),
            "kv_dtype": W.ToggleButtons(options=["bf16", "fp8"], value="fp8",
                                        description="KV dtype", **buttons),
            "state_dtype": W.ToggleButtons(options=["fp32", "bf16"], value="bf16",
                                           description="state dtype", **buttons),
            "tp": W.ToggleButtons(options=[1, 2, 4, 8], value=4, description="TP (GPUs)",
                                  **buttons),
            "pool_gib": W.FloatSlider(33.33, min=1.0, max=120.0, step=0.01, readout_format=".2f",
                                      description="pool budget (GiB/GPU)", **wide),
            "max_running_requests": W.IntSlider(132, min=1, max=1024,
                                                description="running (requests)",
                                                **tokens),
            "slots_per_request": W.IntSlider(1, min=1, max=4, description="state slots / request",
                                             **wide),
            "extra_slots": W.IntSlider(6, min=0, max=64, description="in flight (slots)",
                                       **wide),
            "spec_slots": W.IntSlider(0, min=0, max=1024, description="speculative slots",
                                      **tokens),
        }
        self.controls, self.out, self.budget = c, W.Output(), None
        for w in c.values():
            w.observe(lambda _: self.update(), names="value")
        self.widget = W.VBox([grid(list(c.values())), self.out], layout=W.Layout(width="100%"))
        self.update()

    def set(self, **values) -> Budget | None:
        for k, v in values.items():
            self.controls[k].value = v
        return self.budget

    def _spec_bytes_per_slot(self, v: dict) -> int:
        if self.base is not None and self.base.spec_bytes_per_slot:
            return self.base.spec_bytes_per_slot
        ring = spec_state_bytes(self.cfg, width=VERIFY_WIDTH, state_dtype=_DT[v["state_dtype"]],
                                tp=v["tp"])
        return ring["replay"]["total"]

    def inputs(self) -> BudgetInputs:
        v = {k: w.value for k, w in self.controls.items()}
        dtypes = CacheDtypes(latent=_DT[v["kv_dtype"]], pool_keys=torch.float8_e4m3fn,
                             recurrent=_DT[v["state_dtype"]])
        spec = CacheFootprint.of(self.cfg, dtypes, tp=v["tp"])
        if self.base is not None:  # keep e.g. the reference deployment's draft-KV bytes
            draft = self.base.footprint.draft_bytes_per_token
            spec = dataclasses.replace(spec, draft_bytes_per_token=draft)
        return BudgetInputs(
            footprint=spec, context_len=v["context_len"], byte_budget=int(v["pool_gib"] * GIB),
            max_running_requests=v["max_running_requests"], extra_slots=v["extra_slots"],
            slots_per_request=v["slots_per_request"], spec_slots=v["spec_slots"],
            spec_bytes_per_slot=self._spec_bytes_per_slot(v),
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
            display(budget_view(self.budget))
            display(budget_figure(self.budget))

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)


def slot_accounting_figure(acct) -> go.Figure:
    """Measured token slots with and without the kv_only cache beside Lp + N x Ls / N x (Lp+Ls)."""
    names = ["kv_only cache", "no cache"]
    fig = go.Figure([
        go.Bar(name="measured", x=names, y=[acct.token_slots_shared, acct.token_slots_unshared]),
        go.Bar(name="Lp + N x Ls  /  N x (Lp + Ls)", x=names,
               y=[acct.expected_shared, acct.expected_unshared]),
    ])
    fig.update_layout(barmode="group")
    return finish(fig, f"{acct.num_requests} requests, Lp={acct.prefix_len}, "
                       f"Ls={acct.suffix_len}, hit rate {acct.hit_rate:.0%}", height=300,
                  xaxis="decode engine's prefix cache", yaxis="token slots in use")


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
    fig.update_layout(yaxis2={"overlaying": "y", "side": "right", "rangemode": "tozero"})
    return finish(fig, f"Pools over {len(steps)} engine steps", height=340, right_axis=True,
                  xaxis="engine step", yaxis="pages / state slots", yaxis2="requests in step")
