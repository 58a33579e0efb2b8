"""notebooks/05_pd_serving.ipynb runs top to bottom on a CPU: a 1P1D service, the seed's three
shared-prefix workloads scaled down, the plots and the transfer timeline."""

from __future__ import annotations

from glmlab.testing.notebooks import run_notebook


def test_pd_serving_notebook_runs():
    nb = run_notebook("05_pd_serving.ipynb", timeout=300)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    for label in ("0.00% shared", "50.00% shared", "93.75% shared"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
        completed, failed = row.split("|")[2:4]
        assert completed.strip() == "16" and failed.strip() == "0", row
    assert "12 requests; NIXL WRITE time per request" in text
    assert "service stopped" in text
