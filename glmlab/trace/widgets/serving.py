"""Views of the service and of prefill dataflow: the shared-prefix benchmark as a table and bars,
the per-request PD transfer timeline (notebook 05); the FP8 all-gather packet, the recorded
all-gather times and the reference deployment's prefill ladder (notebook 06).

Rows come from ``glmlab.bench.serving``, ``glmlab.serve.timeline`` and
``glmlab.bench.cp_report``; nothing here measures or derives a number.
"""

from __future__ import annotations

import plotly.graph_objects as go
from IPython.display import HTML
from plotly.subplots import make_subplots

from glmlab.trace.widgets.layout import finish, table

BENCH_COLUMNS = [
    ("completed", "completed"), ("failed", "failed"), ("output_throughput", "output tok/s"),
    ("input_throughput", "input tok/s"), ("mean_ttft_ms", "mean TTFT ms"),
    ("mean_tpot_ms", "mean TPOT ms"), ("p99_tpot_ms", "p99 TPOT ms"),
    ("cache_hit_rate", "cache hit rate")]
PHASE_COLORS = {"wait for room": "#bbbbbb", "prefill": "#1f77b4", "write": "#d62728",
                "transfer": "#ff7f0e", "decode": "#2ca02c"}


def serving_table(results: dict[str, dict]) -> HTML:
    """``{workload: last benchmark row}``: one line per workload."""
    rows = [{"workload": label, **row} for label, row in results.items()]
    return table(rows, [("workload", "workload"), *BENCH_COLUMNS],
                 caption="Shared-prefix workloads through the 1P1D service")


def serving_bars(results: dict[str, dict], title: str) -> go.Figure:
    """Output throughput, mean TTFT and mean TPOT per workload, side by side."""
    keys = (("output_throughput", "output tokens/s"), ("mean_ttft_ms", "mean TTFT (ms)"),
            ("mean_tpot_ms", "mean TPOT (ms)"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[k[1] for k in keys],
                        horizontal_spacing=0.12)
    labels = list(results)
    for i, (key, _) in enumerate(keys, start=1):
        fig.add_trace(go.Bar(x=labels, y=[results[k][key] for k in labels], showlegend=False),
                      row=1, col=i)
    axes = {f"xaxis{'' if i == 1 else i}": "system prompt shared" for i in (1, 2, 3)}
    axes |= {f"yaxis{'' if i == 1 else i}": k[1] for i, k in enumerate(keys, start=1)}
    return finish(fig, title, height=330, **axes)


def recent_requests(rows: list[dict], n: int) -> list[dict]:
    """The timeline rows of the last ``n`` requests to start (by bootstrap room)."""
    first = {}
    for r in rows:
        first[r["room"]] = min(first.get(r["room"], r["start"]), r["start"])
    keep = set(sorted(first, key=first.get)[-n:])
    return [r for r in rows if r["room"] in keep]


def pd_timeline_figure(rows: list[dict]) -> go.Figure:
    """One prefill lane and one decode lane per request, each phase a bar from start to end."""
    fig = go.Figure()
    for phase, color in PHASE_COLORS.items():
        part = [r for r in rows if r["phase"] == phase]
        fig.add_trace(go.Bar(name=phase, orientation="h", marker_color=color,
                             y=[f'{r["request"]} {r["side"]}' for r in part],
                             x=[max(r["end"] - r["start"], 1e-4) for r in part],
                             base=[r["start"] for r in part]))
    fig.update_layout(barmode="overlay")
    return finish(fig, "One request = a prefill lane and a decode lane (same room)", height=520,
                  xaxis="time (s)", yaxis="request, worker")


# ---------------------------------------------------------------- prefill dataflow (06)
def packet_figure(layout, title: str) -> go.Figure:
    """One token's all-gather payload: the FP8 packet's fields beside the BF16 hidden state."""
    fig = go.Figure()
    for name, first, size in layout.fields():
        fig.add_bar(y=["FP8 packet"], x=[size], orientation="h",
                    name=f"{name}: bytes {first}..{first + size - 1}")
    fig.add_bar(y=["BF16 hidden"], x=[layout.bf16_bytes_per_token()], orientation="h",
                name="bf16 hidden state")
    fig.update_layout(barmode="stack")
    return finish(fig, title, height=240, xaxis="bytes per token on the MoE all-gather",
                  yaxis="payload")


def allgather_figure(allgather: dict, title: str) -> go.Figure:
    """``summarize(rows)['allgather']``: BF16 vs FP8-packet all-gather time per step size."""
    ts = list(allgather)
    fig = go.Figure([go.Bar(name=name, x=[str(t) for t in ts], y=[allgather[t][key] for t in ts])
                     for name, key in (("BF16 hidden", "bf16_ms"), ("FP8 packets", "fp8_ms"))])
    fig.update_layout(barmode="group")
    return finish(fig, title, height=320, xaxis="tokens per step (all ranks)",
                  yaxis="all-gather time (ms)")


def ladder_figure(steps: list[dict], title: str) -> go.Figure:
    """``ladder_steps()``: each rung's input tokens/s as a waterfall from the first."""
    fig = go.Figure(go.Waterfall(
        x=[s["config"] for s in steps], measure=["absolute"] + ["relative"] * (len(steps) - 1),
        y=[steps[0]["input_tok_s"]] + [b["input_tok_s"] - a["input_tok_s"]
                                       for a, b in zip(steps, steps[1:], strict=False)],
        showlegend=False))
    return finish(fig, title, height=360, xaxis="configuration (each rung adds one change)",
                  yaxis="input tokens/s (4 x H200)")
