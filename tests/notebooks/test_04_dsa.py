"""notebooks/04_dsa_kernels.ipynb runs top to bottom on a CPU (tiny model, references, results)."""

from __future__ import annotations

from glmlab.testing.notebooks import run_notebook


def test_dsa_notebook_runs():
    nb = run_notebook("04_dsa_kernels.ipynb", timeout=300)
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "| 2112 | 128 | 17 | 64 |" in text and "| 2112 | 32 | 66 | 0 |" in text
    assert "block_i=128 heads_per_cta=64 splits=1" in text  # 64-head CTAs take 128-wide tiles
    assert "speedup_128_over_32" in text and "NVIDIA H200" in text  # the committed H200 rows
