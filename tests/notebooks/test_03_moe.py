"""notebooks/03_moe_tuning.ipynb runs top to bottom on the CPU and shows what it promises."""

from __future__ import annotations

from glmlab.testing.notebooks import run_notebook


def test_moe_tuning_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("GLMLAB_CACHE_DIR", str(tmp_path))
    nb = run_notebook("03_moe_tuning.ipynb")
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/html", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "seed: M1024 tuning" in text and "+3.12%" in text
    assert "fused MoE vs W8A8 reference, max |diff|: 0.0" in text
    figures = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if {"application/vnd.plotly.v1+json", "application/vnd.jupyter.widget-view+json"}
               & set(o.get("data", {}))]
    assert len(figures) >= 4
