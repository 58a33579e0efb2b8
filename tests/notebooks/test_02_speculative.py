from glmlab.testing.notebooks import run_notebook


def test_speculative_notebook_runs():
    nb = run_notebook("02_speculative.ipynb")
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/html", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert text.count("lossless: True") == 5, text
    assert "oracle-W8: lossless: True" in text and "acceptance length 8.00" in text
    assert "MTP718 [simulated accept" in text and "DFlash2-B8 draft-kv" in text
    assert "seed, 4xH200 (Figure 3)" in text and "11.80" in text and "10.55" in text
    assert "frees 5.79 GB" in text
    assert "engine:" in text and "acceptance length 7." in text and "speculative workspace" in text
    views = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert views, "the cycle explorer widget did not render"
