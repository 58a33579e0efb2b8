"""notebooks/01_hybrid_cache.ipynb runs top to bottom on a CPU; the numbers it computed are right.

The values are read from the notebook's kernel (not from its printed text) and checked against
derivations made here: the reference budgets planned in this process, Lp + N x Ls page-rounded,
and the prefix-cache hits the workload implies.
"""

from __future__ import annotations

from glmlab.cache.budget import GIB, plan_budget
from glmlab.cache.budget_report import REFERENCE_POOLS, reference_final
from glmlab.testing.notebooks import run_notebook_probe

PAGE = 64


def test_hybrid_cache_notebook_computes_what_it_shows():
    nb, got = run_notebook_probe("01_hybrid_cache.ipynb", {
        "shared": "acct.token_slots_shared", "unshared": "acct.token_slots_unshared",
        "cached": "[o.cached_tokens for o in outs]",
        "hit_rate": "llm.engine.cache.stats.hit_rate",
        "explorer_running": "b.max_running_requests",
        "explorer_binding": "[c.kind for c in b.binding]",
        "explorer_state_gib": "b.state_bytes / 2**30",
    })
    # section 3: 8 requests share 1,024 tokens and bring 60 each (one page of their own)
    own = -(-60 // PAGE) * PAGE
    assert got["shared"] == 1024 + 8 * own
    assert got["unshared"] == 8 * (1024 + own)
    # section 4: 12 requests behind a 256-token prefix, at most 4 running: the first wave computes
    # it, the later ones find it (whole pages) in the kv_and_state tree
    cached = got["cached"]
    assert len(cached) == 12 and cached[0] == 0
    assert all(c >= 256 - PAGE for c in cached[4:])  # at most the first wave of 4 misses
    prompt_tokens = 12 * (256 + 40)
    assert abs(got["hit_rate"] - sum(cached) / prompt_tokens) < 1e-9
    # section 2: the final configuration at BF16 KV / FP32 state and 3 slots per request
    final = plan_budget(reference_final())
    assert got["explorer_running"] <= final.max_running_requests
    assert got["explorer_state_gib"] > REFERENCE_POOLS["final"]["recurrent + conv state"]
    assert "state-bound" in got["explorer_binding"]
    assert abs(final.state_bytes / GIB - 7.37) < 0.005
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    data = [o.get("data", {}) for o in outs]
    assert sum("application/vnd.plotly.v1+json" in d for d in data) >= 2
    assert any("application/vnd.jupyter.widget-view+json" in d for d in data)
