"""Notebook views: the only glmlab package that imports ipywidgets or plotly.

Every number shown is computed elsewhere (``glmlab.cache.budget``, the engine, the benchmarks'
JSONL rows); these modules only lay it out for a reader: tables sized to their rows, axes titled
with units, legends clear of the data, controls at a usable width. ``layout`` holds the shared
conventions; the other modules hold one notebook topic each.
"""

from __future__ import annotations

from glmlab.trace.widgets.budget import (
    BudgetExplorer,
    budget_figure,
    budget_view,
    pool_occupancy_figure,
    reference_comparison,
    slot_accounting_figure,
)
from glmlab.trace.widgets.layout import FigureSwitch, fmt, lines, table, tile_config
from glmlab.trace.widgets.speculative import (
    cost_table,
    cycle_cost_figure,
    cycle_explorer,
    cycle_rows,
    cycle_timeline_figure,
    reference_cycle_rows,
)

__all__ = [
    "BudgetExplorer", "FigureSwitch", "budget_figure", "budget_view", "cost_table",
    "cycle_cost_figure", "cycle_explorer", "cycle_rows", "cycle_timeline_figure", "fmt", "lines",
    "pool_occupancy_figure", "reference_comparison", "reference_cycle_rows",
    "slot_accounting_figure",
    "table", "tile_config",
]
