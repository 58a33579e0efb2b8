"""notebooks/01_hybrid_cache.ipynb runs top to bottom on a CPU and shows what it promises."""

from __future__ import annotations

from glmlab.testing.notebooks import run_notebook


def test_hybrid_cache_notebook_runs():
    nb = run_notebook("01_hybrid_cache.ipynb")
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/html", "")) for o in outs)
    assert "<td>46.72</td><td>46.72</td>" in text and "<td>7.37</td><td>7.37</td>" in text
    assert "max running requests: 132 (requested = state-bound)" in text
    assert "no sharing: 36" in text
    assert "shared: 1536 (Lp + N x Ls = 1536); unshared: 8704 (N x (Lp + Ls) = 8704)" in text
    assert "cached prompt tokens per request: [0," in text and "Perfetto" in text
    data = [o.get("data", {}) for o in outs]
    assert sum("application/vnd.plotly.v1+json" in d for d in data) >= 2
    assert any("application/vnd.jupyter.widget-view+json" in d for d in data)
