"""Execute a notebook top to bottom with a real Jupyter kernel (what CI does for every notebook)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]


def run_notebook(name: str, timeout: int = 600) -> nbformat.NotebookNode:
    """Run notebooks/<name> in a scratch copy (the committed file keeps no outputs)."""
    path = ROOT / "notebooks" / name
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count")):
            raise AssertionError(f"{name}: committed with outputs; strip them (nbstripout)")
    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    return nb


PROBE_MARK = "__glmlab_probe__"


def run_notebook_probe(name: str, probe: dict[str, str],
                       timeout: int = 600) -> tuple[nbformat.NotebookNode, dict]:
    """Run the notebook, then evaluate ``probe`` (name -> Python expression) in its kernel: the
    values the notebook itself computed, for tests to check against an independent derivation
    (rather than against text the notebook printed)."""
    path = ROOT / "notebooks" / name
    nb = nbformat.read(path, as_version=4)
    exprs = ", ".join(f"{k!r}: ({v})" for k, v in probe.items())
    nb.cells.append(nbformat.v4.new_code_cell(
        f"import json as _json\nprint({PROBE_MARK!r} + _json.dumps({{{exprs}}}, default=str))"))
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    line = next(x for x in text.splitlines() if x.startswith(PROBE_MARK))
    nb.cells.pop()
    return nb, json.loads(line[len(PROBE_MARK):])
