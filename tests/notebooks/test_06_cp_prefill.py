"""notebooks/06_cp_prefill.ipynb runs top to bottom on a CPU: packet layout and bytes, a CP2
prefill in two gloo processes checked against one process, the recorded 2xH200 numbers, the
seed's prefill ladder."""

from __future__ import annotations

from glmlab.testing.notebooks import run_notebook


def test_cp_prefill_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("GLMLAB_CACHE_DIR", str(tmp_path))
    nb = run_notebook("06_cp_prefill.ipynb", timeout=300)
    text = "\n".join(o.get("text", "") + str(o.get("data", {}).get("text/markdown", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "| 4096 | 8 | 8192 | 4288 | 0.5234 | 47.7% |" in text
    assert "| 32768 | 4 | 192 MiB | 100 MiB |" in text
    rows = [line for line in text.splitlines() if line.startswith("| bf16 dispatch")
            or line.startswith("| fp8-packet dispatch")]
    assert len(rows) == 3, text
    exact = [float(r.split("|")[3]) for r in rows[:2]]  # rel RMS vs plain / vs same recipe
    assert max(exact) < 1e-5, rows
    assert "| FP8 comm + fusion + scheduling | 48,064 | 1.047x | 2.06x |" in text
    # The recorded 2xH200 rows (data/bench/cp.jsonl) are read and tabulated.
    cells = [line.split("|") for line in text.splitlines() if line.count("|") == 6]
    gathers = {c[1].strip() for c in cells if c[4].strip() == "0.523"}  # bytes ratio column
    assert gathers >= {"8192", "32768"}, text
