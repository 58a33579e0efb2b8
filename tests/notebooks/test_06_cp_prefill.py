"""notebooks/06_cp_prefill.ipynb runs top to bottom on a CPU; the numbers it computed are right.

Values are read from the notebook's kernel and checked against derivations made here: the packet
size from its fields, the CP2 prefill (two gloo processes) against one process, the reference
deployment's ladder from its published rungs, and, while no stamped 2-GPU rows are committed, the
note naming the command that writes them.
"""

from __future__ import annotations

import math

from glmlab.bench.cp_report import REFERENCE_PREFILL_LADDER
from glmlab.testing.notebooks import run_notebook_probe


def test_cp_prefill_notebook_computes_what_it_shows(tmp_path, monkeypatch):
    monkeypatch.setenv("GLMLAB_CACHE_DIR", str(tmp_path))
    nb, got = run_notebook_probe("06_cp_prefill.ipynb", {
        "packet": "real.bytes_per_token", "bf16": "real.bf16_bytes_per_token()",
        "exact": "[diff_stats(r, o)['rel_rms']"
                 " for r, o in ((plain, cp2[0]), (fp8_recipe, cp2[1]))]",
        "fp8_vs_plain": "diff_stats(plain, cp2[1])['rel_rms']",
        "steps": "steps", "n_rows": "len(rows)", "busbw": "busbw",
    }, timeout=300)
    d, k = 4096, 8  # E4M3 values, an fp32 scale per 128, (id, weight) per routed expert, 64 B rows
    assert got["bf16"] == 2 * d
    assert got["packet"] == -(-(d + 4 * d // 128 + 8 * k) // 64) * 64
    assert max(got["exact"]) < 1e-5  # same maths in two processes as in one
    # the FP8 packets quantise the dispatched activations: against the plain model they differ
    assert max(got["exact"]) < got["fp8_vs_plain"] < 0.5
    steps, ladder = got["steps"], REFERENCE_PREFILL_LADDER
    assert [s["input_tok_s"] for s in steps] == [r[1] for r in ladder]
    assert abs(steps[-1]["cumulative_x"] - ladder[-1][1] / ladder[0][1]) < 1e-9
    assert abs(math.prod(s["step_x"] for s in steps) - steps[-1]["cumulative_x"]) < 1e-9
    if got["n_rows"] == 0:
        text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/html", ""))
                       for c in nb.cells if c.cell_type == "code" for o in c.outputs)
        assert "No stamped H200 rows in data/bench/cp.jsonl yet" in text
        assert got["busbw"] == 284.0  # the documented fallback bandwidth
