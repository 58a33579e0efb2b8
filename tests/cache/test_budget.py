"""The budget reproduces the seed's per-GPU decode accounting (TP4) and explains every cap.

What is derived from the model shape alone, and checked against the seed's figures (GiB):
FP32 state over 56 slots (+1 padding) = 1.96; BF16 state over 414 (+1) = 7.37; 46.72 GiB of BF16
KV holds 64 full-context requests (64K + 1K); 14.00 GiB of FP8 KV holds 36 without sharing and
thousands with a 65,472-token shared prefix (Lp + N x Ls). The byte budgets themselves are the
seed's pool sums (its static budget after weights is not published).
"""

from __future__ import annotations

import dataclasses

import pytest

from glmlab.cache.budget import GIB, BudgetError, kv_bound, plan_budget
from glmlab.cache.budget_report import seed_baseline, seed_final


def _gib(x: int) -> float:
    return round(x / GIB, 2)


def test_seed_baseline_fp32_state_and_bf16_kv():
    b = plan_budget(seed_baseline())
    # 34 x (16x128x128x4 + 3x6144x2)
    assert b.inputs.footprint.kda_state_bytes_per_slot == 36_904_960
    assert b.num_state_slots == 57 and _gib(b.state_bytes) == 1.96
    assert abs(b.kv_bytes / GIB - 46.72) < 0.01
    assert b.inputs.footprint.kv_bytes_per_token == 11 * (1024 + 33)
    assert b.max_running_requests == 56
    caps = {c.kind: c.value for c in b.caps}
    assert caps == {"requested": 56, "state-bound": 56, "KV-bound": 64}
    assert not b.overcommitted


def test_seed_final_bf16_state_fp8_kv_draft_kv_and_sharing():
    b = plan_budget(seed_final())
    assert b.inputs.footprint.kda_state_bytes_per_slot == 19_079_168  # BF16 halves the state
    assert b.num_state_slots == 415 and _gib(b.state_bytes) == 7.37
    assert b.inputs.footprint.kv_bytes_per_token == 11 * (528 + 33)
    assert abs(b.kv_bytes / GIB - 14.00) < 0.02 and abs(b.draft_kv_bytes / GIB - 11.96) < 0.02
    caps = {c.kind: c.value for c in b.caps}
    assert caps["state-bound"] == 414 // 3 - 6 == 132 == b.max_running_requests
    assert caps["KV-bound"] > 2000  # Lp + N x Ls
    assert kv_bound(b.num_pages - 1, b.inputs.context_len, 0, 64) == 36  # N x (Lp + Ls)
    assert "no sharing: 36" in b.table()


def test_kv_only_tree_needs_one_state_slot_per_request():
    b = plan_budget(seed_final(slots_per_request=1))
    assert b.num_state_slots == 139 and b.max_running_requests == 132
    assert b.kv_bytes > plan_budget(seed_final()).kv_bytes  # the freed state memory becomes KV


def test_kv_bound_is_lp_plus_n_ls_page_rounded():
    # 10 requests of 300 tokens sharing 200: 3 shared pages + 10 x ceil(108 / 64) = 23 pages
    assert kv_bound(23, 300, 200, 64) == 10
    assert kv_bound(22, 300, 200, 64) == 9
    assert kv_bound(50, 300, 0, 64) == 10  # without sharing: 5 pages each


def test_auto_sizing_fits_full_context_requests_and_states():
    x = dataclasses.replace(seed_baseline(), max_running_requests=None, state_slots=None)
    b = plan_budget(x)
    caps = {c.kind: c.value for c in b.caps}
    assert b.max_running_requests == caps["state-bound"] == caps["KV-bound"] == 64
    per_request = 1040 * 64 * x.footprint.kv_bytes_per_token + x.footprint.state_bytes_per_slot
    assert b.pool_bytes < 65 * per_request  # a 65th full-context request would not fit


def test_device_memory_mem_fraction_and_weights():
    x = dataclasses.replace(seed_baseline(), byte_budget=None, device_bytes=140 * GIB,
                            mem_fraction=0.9, weight_bytes=76 * GIB)
    assert plan_budget(x).pool_bytes == int(140 * GIB * 0.9) - 76 * GIB


def test_overcommit_is_flagged_not_refused():
    x = dataclasses.replace(seed_baseline(), max_running_requests=100, state_slots=None)
    b = plan_budget(x)
    assert b.max_running_requests == 100 and b.overcommitted
    assert "preempt" in b.table()


def test_impossible_budgets_say_why():
    with pytest.raises(BudgetError, match="cannot hold one request"):
        plan_budget(dataclasses.replace(seed_baseline(), byte_budget=GIB // 2,
                                        max_running_requests=None, state_slots=None))
    with pytest.raises(BudgetError, match="no room for KV"):
        plan_budget(dataclasses.replace(seed_baseline(), byte_budget=GIB))
    with pytest.raises(BudgetError, match="byte budget"):
        plan_budget(dataclasses.replace(seed_baseline(), byte_budget=None))
