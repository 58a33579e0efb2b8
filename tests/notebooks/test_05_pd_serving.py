"""notebooks/05_pd_serving.ipynb runs top to bottom on a CPU: a 1P1D service, the seed's three
shared-prefix workloads scaled down, the plots and the transfer timeline."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "05_pd_serving.ipynb"


def test_pd_serving_notebook_runs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "strip outputs"
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    for label in ("0.00% shared", "50.00% shared", "93.75% shared"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
        completed, failed = row.split("|")[2:4]
        assert completed.strip() == "16" and failed.strip() == "0", row
    assert "12 requests; NIXL WRITE time per request" in text
    assert "service stopped" in text
