"""Notebook 06's view of the CP benchmark rows: the all-gather, MoE-layer and prefill tables of
``glmlab.bench.cp_report.summarize`` and the all-gather figure. It lays out what the summary holds;
the ratios are computed in ``cp_report``, the measurements by ``glmlab.bench.ops --op cp``."""

from __future__ import annotations

from IPython.display import Markdown, display

from glmlab.trace.widgets.serving import allgather_figure


def cp_tables(summary: dict) -> None:
    """Display the three tables (and the figure when there are all-gather rows)."""
    out = ["| T | BF16 all-gather ms | FP8 packets ms | bytes ratio | time ratio |",
           "|---|---|---|---|---|"]
    for t, g in summary["allgather"].items():
        out.append(f"| {t} | {g['bf16_ms']:.3f} | {g['fp8_ms']:.3f} | {g['bytes_ratio']:.3f} "
                   f"| {g['time_ratio']:.3f} |")
    display(Markdown("\n".join(out)))
    out = ["| T | dispatch / packet kernels | B/token gathered | dispatch ms | MoE layer ms |",
           "|---|---|---|---|---|"]
    for t, by in summary["moe"].items():
        for name, m in by.items():
            out.append(f"| {t} | {name} | {m['bytes_per_token']} | {m['dispatch_ms']:.2f} "
                       f"| {m['layer_ms']:.2f} |")
    display(Markdown("\n".join(out)))
    out = ["| prefill | input tok/s | CP1 tok/s | CP / CP1 |", "|---|---|---|---|"]
    for key, p in summary["prefill"].items():
        cp1 = f"{p['cp1_input_tok_s']:.0f}" if p["cp1_input_tok_s"] else "-"
        ratio = f"{p['speedup']:.2f}x" if p["speedup"] else "-"
        out.append(f"| {key} | {p['input_tok_s']:.0f} | {cp1} | {ratio} |")
    display(Markdown("\n".join(out)))
    if summary["allgather"]:
        allgather_figure(summary["allgather"], "MoE all-gather, 2 x H200").show()
