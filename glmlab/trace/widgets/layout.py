"""Shared layout for the notebook views: HTML tables, printed lines that wrap at spaces, figure
conventions (title, axis titles, a legend above the plot), controls at a usable width, and a
keyboard-operable switch between figures.

Sized for the narrowest output area we lay out for: JupyterLab at 1280 px with the file browser
open gives about 840 px. Knows nothing about what the numbers mean.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Sequence

import ipywidgets as W
import plotly.graph_objects as go
from IPython.display import HTML, display

OUTPUT_PX = 840
LABEL_PX = 150  # control descriptions with their unit fit in one line

_TABLE_CSS = """<style>
.glmlab-table {table-layout: auto; margin: 0.2em 0 0.8em 0; font-size: 12px;}
.glmlab-table td {white-space: nowrap; padding: 2px 6px; text-align: right;}
.glmlab-table th {white-space: normal; padding: 2px 6px; text-align: right; max-width: 7em;
  vertical-align: bottom;}
.glmlab-table td.glmlab-text, .glmlab-table th.glmlab-text {text-align: left; max-width: 28em;
  white-space: normal;}
.glmlab-table caption {caption-side: top; text-align: left; font-weight: 600; padding: 2px 0;}
.glmlab-lines div {white-space: pre-wrap; word-break: normal; overflow-wrap: normal;
  padding-left: 2em; text-indent: -2em; font-family: var(--jp-code-font-family); font-size: 12px;
  line-height: 1.4;}
</style>"""

_TILE = re.compile(r"^M(\d+)N(\d+)K(\d+)G(\d+)w(\d+)s(\d+)$")


def tile_config(s: str | None) -> str:
    """``M16N64K128G16w4s4`` -> ``BM16 BN64 BK128 G16 w4 s4`` (blocks M/N/K, group, warps,
    stages)."""
    if not s:
        return ""
    m = _TILE.match(s)
    # non-breaking spaces: a table may wrap its text columns, never inside one config
    return "\u00a0".join(f"BM{m[1]} BN{m[2]} BK{m[3]} G{m[4]} w{m[5]} s{m[6]}".split()) if m else s


def fmt(v) -> str:
    """A cell: blank for missing values, thousands separators, about four significant digits."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.1f}"
        return f"{v:.4g}" if a >= 1e-3 or a == 0 else f"{v:.2e}"
    return str(v)


Column = str | tuple[str, str]  # key, or (key, header with its unit)


def table(rows: Sequence[dict], columns: Sequence[Column] | None = None, *, caption: str = "",
          formats: dict[str, Callable] | None = None) -> HTML:
    """Rows of dicts as one HTML table, every row shown; text columns left-aligned."""
    if not rows:
        return HTML(f"<p>{html.escape(caption)} (no rows)</p>")
    # a bare key becomes its header with spaces, so a long name can wrap between its words
    cols = [(c, c.replace("_", " ")) if isinstance(c, str) else c
            for c in (columns or list(rows[0]))]
    formats = formats or {}
    text = {k for k, _ in cols if all(isinstance(r.get(k), str) or r.get(k) is None
                                      for r in rows)}
    cls = lambda k: ' class="glmlab-text"' if k in text else ""
    head = "".join(f"<th{cls(k)}>{html.escape(h)}</th>" for k, h in cols)
    body = "".join(
        "<tr>" + "".join(f"<td{cls(k)}>{_cell(formats.get(k, fmt)(r.get(k)))}</td>"
                         for k, _ in cols) + "</tr>" for r in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return HTML(f'{_TABLE_CSS}<table class="glmlab-table">{cap}<thead><tr>{head}</tr></thead>'
                f"<tbody>{body}</tbody></table>")


def _cell(text: str) -> str:
    return html.escape(text).replace("\n", "<br>")  # a cell may hold stacked lines


def lines(texts: Sequence[str] | str) -> HTML:
    """Printed lines that wrap at spaces with a hanging indent, never inside a number."""
    if isinstance(texts, str):
        texts = texts.splitlines()
    body = "".join(f"<div>{html.escape(t)}</div>" for t in texts)
    return HTML(f'{_TABLE_CSS}<div class="glmlab-lines">{body}</div>')


def _legend_rows(fig: go.Figure, width: int = OUTPUT_PX - 100) -> int:
    seen, px = set(), []
    for t in fig.data:
        key = t.legendgroup or t.name
        if t.showlegend is False or not t.name or key in seen:
            continue
        seen.add(key)
        px.append(40 + 7 * len(t.name))
    rows, used = 1, 0
    for w in px:
        if used and used + w > width:
            rows, used = rows + 1, 0
        used += w
    return rows if px else 0


def finish(fig: go.Figure, title: str, *, height: int, right_axis: bool = False,
           **axes: str) -> go.Figure:
    """Title on top, the legend in rows along the bottom edge (never over the plot, the right
    axis or the title), axis titles from ``axes`` (``xaxis="M (tokens)"``, ``yaxis2="requests"``);
    ``height`` is the plot's, the legend's rows are added to it."""
    rows = _legend_rows(fig)
    bottom = 60 + 24 * rows
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left", "y": 0.98, "yanchor": "top",
               "yref": "container"},
        height=height + 24 * rows, showlegend=rows > 0,
        margin={"l": 80, "r": 80 if right_axis else 30, "t": 56, "b": bottom},
        legend={"orientation": "h", "x": 0, "xanchor": "left", "y": 0, "yanchor": "bottom",
                "yref": "container", "bgcolor": "rgba(0,0,0,0)"})
    for name, text in axes.items():
        fig.update_layout({name: {"title": {"text": text}}})
    return fig


def control_layout(width: str = "100%") -> dict:
    """Keyword arguments for a slider / dropdown / toggle: a full-width row, a fixed label."""
    return {"layout": W.Layout(width=width), "style": {"description_width": f"{LABEL_PX}px"}}


def grid(children: Sequence[W.Widget], columns: int = 2) -> W.GridBox:
    return W.GridBox(list(children), layout=W.Layout(
        grid_template_columns=f"repeat({columns}, minmax(0, 1fr))", grid_gap="4px 24px",
        width="100%"))


class FigureSwitch:
    """One figure at a time, chosen with toggle buttons (keyboard: Tab, then Space). The figure
    is drawn into an Output as a plain plotly figure: no FigureWidget, whose every instance ships
    the whole plotly.js bundle to the page."""

    def __init__(self, figures: dict[str, go.Figure], description: str):
        self.figures = figures
        self.buttons = W.ToggleButtons(options=list(figures), value=next(iter(figures)),
                                       description=description, **control_layout("auto"))
        self.out = W.Output()
        self.buttons.observe(lambda change: self.show(change["new"]), "value")
        self.widget = W.VBox([self.buttons, self.out])
        self.show(self.buttons.value)

    def show(self, label: str) -> None:
        show_figure(self.out, self.figures[label])

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)


def show_figure(out: W.Output, fig: go.Figure) -> None:
    """Replace what ``out`` shows with ``fig``."""
    with out:
        out.clear_output(wait=True)
        display(fig)
