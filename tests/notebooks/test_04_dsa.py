"""notebooks/04_dsa_kernels.ipynb runs top to bottom on a CPU; the numbers it computed are right.

Values are read from the notebook's kernel and checked against derivations made here: tile counts
from the index width, the dispatch rule's picks, and the variant ratios recomputed from the
committed H200 rows (``data/bench/dsa.jsonl``, written by ``scripts/h200_dsa.sh``).
"""

from __future__ import annotations

import json

from glmlab.bench.ops_dsa_views import RESULTS
from glmlab.testing.notebooks import run_notebook_probe


def test_dsa_notebook_computes_what_it_shows():
    nb, got = run_notebook_probe("04_dsa_kernels.ipynb", {
        "iterations": "dsa.reference_iteration_table()",
        "rules": "dsa.rule_table()",
        "speedups": "dsa.variant_speedups(results)",
        "checks": "dsa.reference_check()",
        "n_results": "len(results)",
    }, timeout=300)
    for r in got["iterations"]:  # whole tiles over the index list, the last one padded
        assert r["tile_iterations"] == -(-r["index_width"] // r["block_i"])
        assert r["virtual_pad"] == r["tile_iterations"] * r["block_i"] - r["index_width"]
    by_case = {(r["layout"], r["rows"], r["heads"]): r["config"] for r in got["rules"]}
    assert "heads_per_cta=64" in by_case[("bf16", 1024, 64)]  # 64 heads: one wgmma CTA
    assert all(c["max_abs_diff"] < 1e-4 for c in got["checks"])
    rows = [json.loads(x) for x in RESULTS.read_text().splitlines() if x]
    assert got["n_results"] == len(rows) and all(r["commit"] and r["command"] for r in rows)
    us = {(r["rows"], r["heads"], r["layout"], r["variant"]): r["kernel_us"]
          for r in rows if r["op"] == "sparse_mla" and r.get("kernel_us")}
    assert got["speedups"], "no case with a rule row"
    for s in got["speedups"]:
        case = (s["rows"], s["heads"], s["layout"])
        assert s["rule_us"] == us[(*case, "rule")]
        if s["rule_over_sglang"] is not None:
            assert abs(s["rule_over_sglang"] - us[(*case, "sglang")] / s["rule_us"]) < 1e-12
        timed = {v: t for (r, h, lay, v), t in us.items() if (r, h, lay) == case}
        assert s["fastest"] == min(timed, key=timed.get)
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert sum("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outs) >= 3
