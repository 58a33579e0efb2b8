from glmlab.testing.notebooks import run_notebook


def test_tour_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("GLMLAB_CACHE_DIR", str(tmp_path))
    nb = run_notebook("00_tour.ipynb")
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "313.3268B" in text and "7.4326B" in text and "17.3767B" in text
    assert "140.8 MiB" in text or "141.6 MiB" in text
