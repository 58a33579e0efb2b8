"""Execute a notebook top to bottom with a real Jupyter kernel (what CI does for every notebook)."""

from __future__ import annotations

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
