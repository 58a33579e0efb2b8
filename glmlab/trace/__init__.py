"""Execution traces: frozen event records (``events``), tracers that keep and export them as JSONL
or Perfetto/Chrome traces (``tracer``), and notebook views (``widgets``, plotly + ipywidgets)."""
