"""The budget derives the reference deployment's per-GPU decode pools (TP4) and explains every cap.

Inputs are only what the deployment chose (device, static fraction, running limit, state slots,
dtypes, context, shared prefix); weights, state per slot, KV per token, the ReplaySSM ring and
hence every pool come from the model shape. The published figures are expected values:
state pools exactly (1.96 / 7.37 GiB); KV pools from above, since SGLang also reserves memory for
CUDA graphs and activations that it does not publish.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from glmlab.cache.budget import GIB, BudgetError, kv_bound, plan_budget
from glmlab.cache.budget_report import (
    H200_BYTES,
    REFERENCE_POOLS,
    reference_baseline,
    reference_final,
    replayssm_ring_bytes,
    weight_bytes,
)
from glmlab.presets import preset_config

PUBLISHED_TEXT_BYTES = 327_199_517_560  # checkpoint total_size minus the vision tower


def _gib(x: int) -> float:
    return round(x / GIB, 2)


def test_weight_bytes_are_the_published_checkpoint_size():
    cfg = preset_config("full")
    assert weight_bytes(cfg, with_mtp=True) == PUBLISHED_TEXT_BYTES
    per_gpu = weight_bytes(cfg, tp=4)
    assert 74 * GIB < per_gpu < 75 * GIB  # without the MTP layer, over four GPUs
    tiny = preset_config("tiny")
    n = sum(p.numel() for p in _meta_model(tiny).parameters())
    assert 2 * n <= weight_bytes(tiny) <= 4 * n  # bf16, a few fp32 vectors


def _meta_model(cfg):
    from glmlab.model.glm import GLM5Model

    with torch.device("meta"):
        return GLM5Model(cfg, with_mtp=False)


def test_reference_baseline_pools_follow_from_device_and_weights():
    x = reference_baseline()
    b = plan_budget(x)
    assert b.pool_bytes == int(H200_BYTES * 0.90) - weight_bytes(preset_config("full"), 4)
    # 34 x (16x128x128x4 + 3x6144x2) per slot, 57 rows
    assert x.footprint.kda_state_bytes_per_slot == 36_904_960
    assert b.num_state_slots == 57
    assert _gib(b.state_bytes) == REFERENCE_POOLS["baseline"]["recurrent + conv state"]
    assert x.footprint.kv_bytes_per_token == 11 * (1024 + 33)
    published_kv = REFERENCE_POOLS["baseline"]["target KV"]
    assert published_kv < b.kv_bytes / GIB < 1.10 * published_kv  # minus SGLang's reserve
    caps = {c.kind: c.value for c in b.caps}
    assert caps["requested"] == caps["state-bound"] == 56 == b.max_running_requests
    # the 56 full-context (64K + 1K) requests fit in the derived KV, as in the deployment
    assert caps["KV-bound"] >= 56 and not b.overcommitted
    assert kv_bound(round(published_kv * GIB / (64 * x.footprint.kv_bytes_per_token)),
                    x.context_len, 0, 64) >= 56


def test_reference_final_state_ring_and_kv_split():
    x = reference_final()
    b = plan_budget(x)
    assert x.footprint.kda_state_bytes_per_slot == 19_079_168  # BF16 halves the state
    assert b.num_state_slots == 415
    assert _gib(b.state_bytes) == REFERENCE_POOLS["final"]["recurrent + conv state"]
    assert x.footprint.kv_bytes_per_token == 11 * (528 + 33)
    # docs/techniques.md section 2: 394,240 B per layer and slot, ~5.2 GiB over 415 slots
    assert replayssm_ring_bytes(preset_config("full"), 4) == 34 * 394_240
    assert 5.1 < b.spec_bytes / GIB < 5.3
    ref = REFERENCE_POOLS["final"]
    ours_kv, published = (b.kv_bytes + b.draft_kv_bytes) / GIB, ref["target KV"] + ref["draft KV"]
    assert published < ours_kv < 1.25 * published  # minus SGLang's reserve and draft weights
    split, ref_split = b.draft_kv_bytes / b.kv_bytes, ref["draft KV"] / ref["target KV"]
    assert abs(split - ref_split) / ref_split < 0.05  # same slots, bytes per token as derived
    caps = {c.kind: c.value for c in b.caps}
    assert caps["state-bound"] == 414 // 3 - 6 == 132 == b.max_running_requests
    unshared = kv_bound(b.num_pages - 1, x.context_len, 0, 64)
    assert unshared < 132 < caps["KV-bound"]  # only the shared prefix makes 132 fit
    assert f"no sharing: {unshared}" in b.table()


def test_kv_only_tree_needs_one_state_slot_per_request():
    b = plan_budget(reference_final(slots_per_request=1))
    assert b.num_state_slots == 139 and b.max_running_requests == 132
    assert b.kv_bytes > plan_budget(reference_final()).kv_bytes  # freed state becomes KV


def test_kv_bound_is_lp_plus_n_ls_page_rounded():
    # 10 requests of 300 tokens sharing 200: 3 shared pages + 10 x ceil(108 / 64) = 23 pages
    assert kv_bound(23, 300, 200, 64) == 10
    assert kv_bound(22, 300, 200, 64) == 9
    assert kv_bound(50, 300, 0, 64) == 10  # without sharing: 5 pages each


def test_auto_sizing_fits_full_context_requests_and_states():
    x = dataclasses.replace(reference_baseline(), max_running_requests=None, state_slots=None)
    b = plan_budget(x)
    caps = {c.kind: c.value for c in b.caps}
    n = b.max_running_requests
    assert n == caps["state-bound"] == caps["KV-bound"] > 56
    per_request = 1040 * 64 * x.footprint.kv_bytes_per_token + x.footprint.state_bytes_per_slot
    assert b.pool_bytes < (n + 1) * per_request  # one more full-context request would not fit


def test_byte_budget_overrides_device_memory():
    x = dataclasses.replace(reference_baseline(), byte_budget=40 * GIB)
    assert plan_budget(x).pool_bytes == 40 * GIB


def test_overcommit_is_flagged_not_refused():
    x = dataclasses.replace(reference_baseline(), max_running_requests=100, state_slots=None)
    b = plan_budget(x)
    assert b.max_running_requests == 100 and b.overcommitted
    assert "preempt" in b.table()


def test_impossible_budgets_say_why():
    with pytest.raises(BudgetError, match="cannot hold one request"):
        plan_budget(dataclasses.replace(reference_baseline(), byte_budget=GIB // 2,
                                        max_running_requests=None, state_slots=None))
    with pytest.raises(BudgetError, match="no room for KV"):
        plan_budget(dataclasses.replace(reference_baseline(), byte_budget=GIB))
    with pytest.raises(BudgetError, match="byte budget"):
        plan_budget(dataclasses.replace(reference_baseline(), device_bytes=None))
