"""notebooks/05_pd_serving.ipynb runs top to bottom on a CPU; the numbers it computed are right.

A 1P1D service, the reference deployment's three shared-prefix workloads scaled down, and the
transfer timeline. Values are read from the notebook's kernel: every request completed, the
prefix cache hits grow with the shared share, and each shown request was written over NIXL.
"""

from __future__ import annotations

from glmlab.testing.notebooks import run_notebook_probe


def test_pd_serving_notebook_computes_what_it_shows():
    nb, got = run_notebook_probe("05_pd_serving.ipynb", {
        "results": "{k: {c: v.get(c) for c in ('completed', 'failed', 'cache_hit_rate',"
                   " 'output_throughput')} for k, v in results.items()}",
        "rooms": "len({r['room'] for r in shown})", "write_ms": "write_ms",
    }, timeout=300)
    res = got["results"]
    assert list(res) == ["0.00% shared", "50.00% shared", "93.75% shared"]
    assert all(r["completed"] == 16 and r["failed"] == 0 and r["output_throughput"] > 0
               for r in res.values()), res
    hits = [r["cache_hit_rate"] for r in res.values()]
    assert hits[0] < hits[1] < hits[2], hits  # more shared prefix, more of it found in the tree
    assert got["rooms"] == 12 and len(got["write_ms"]) == 12 and min(got["write_ms"]) > 0
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "service stopped" in text
