"""notebooks/05_pd_serving.ipynb runs top to bottom on a CPU: a 1P1D service, the seed's three
shared-prefix workloads scaled down, the plots and the transfer timeline."""

from __future__ import annotations

from glmlab.testing.notebooks import run_notebook


def test_pd_serving_notebook_runs():
    nb = run_notebook("05_pd_serving.ipynb", timeout=300)
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/html", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    for label in ("0.00% shared", "50.00% shared", "93.75% shared"):  # completed 16, failed 0
        assert f'<td class="glmlab-text">{label}</td><td>16</td><td>0</td>' in text, text
    assert "12 requests; NIXL WRITE time per request" in text
    assert "service stopped" in text
