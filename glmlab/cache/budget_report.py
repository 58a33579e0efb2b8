"""How a budget is shown (the table ``glmlab budget`` and the engine print), and the seed's two
decode configurations as ``BudgetInputs`` (docs/reference-numbers.md section 0,
docs/techniques.md section 3.2).

The seed publishes its pools (per GPU, TP4 decode), not its static budget after weights and
workspaces, so the scenarios take the sum of its pools as the byte budget; what the budget then
derives from the model shape alone (state per slot, tokens per GiB, the caps) is the check.
"""

from __future__ import annotations

import dataclasses

import torch

from glmlab.cache.budget import GIB, Budget, BudgetInputs, plan_budget
from glmlab.cache.footprint import CacheFootprint
from glmlab.cache.storage import CacheDtypes
from glmlab.presets import preset_config

SEED_CONTEXT = 65_536 + 1_024  # 64K prompt + 1K output
SEED_SHARED_PREFIX = 65_472  # decode benchmark: 99.9% shared prefix (docs/techniques.md 3.3)
# DFlash2's draft config is not public (docs/techniques.md section 9); the seed's 11.96 GiB of
# draft KV beside 14.00 GiB of FP8 target KV (6,171 B/token at TP4) implies this many bytes per
# token.
SEED_DRAFT_BYTES_PER_TOKEN = 5_272


def budget_rows(b: Budget) -> list[dict]:
    x, s = b.inputs, b.inputs.footprint
    rows = [
        dict(pool="target KV", per_unit=f"{s.kv_bytes_per_token:,.0f} B/token",
             units=f"{b.token_slots:,} tokens", gib=b.kv_bytes / GIB),
        dict(pool="draft KV", per_unit=f"{s.draft_bytes_per_token:,} B/token",
             units="same slots", gib=b.draft_kv_bytes / GIB),
        dict(pool="recurrent + conv state", per_unit=f"{s.kda_state_bytes_per_slot:,} B/slot",
             units=f"{b.num_state_slots:,} slots (1 padding)", gib=b.state_bytes / GIB),
        dict(pool="DSA index tails", per_unit=f"{s.tail_bytes_per_slot:,} B/slot",
             units=f"{b.num_state_slots:,} slots", gib=b.tail_bytes / GIB),
        dict(pool="speculative workspace", per_unit=f"{x.spec_bytes_per_slot:,} B/slot",
             units=f"{x.spec_slots:,} slots", gib=b.spec_bytes / GIB),
        dict(pool="unused", per_unit="", units="", gib=b.unused_bytes / GIB),
    ]
    return [r for r in rows if r["gib"] or r["pool"] in ("target KV", "recurrent + conv state")]


def budget_table(b: Budget) -> str:
    x, s = b.inputs, b.inputs.footprint
    head = (f"memory budget{' (' + x.label + ')' if x.label else ''}: {s.formats}; "
            f"context {x.context_len:,}, page {x.page_size}")
    lines = [head, f"  {'pool':<24}{'per unit':>20}  {'units':<26}{'GiB':>9}"]
    for r in budget_rows(b):
        lines.append(f"  {r['pool']:<24}{r['per_unit']:>20}  {r['units']:<26}{r['gib']:>9.2f}")
    lines.append(f"  {'total':<24}{'':>20}  {'':<26}{b.pool_bytes / GIB:>9.2f}")
    binding = " = ".join(c.kind for c in b.binding)
    lines.append(f"  max running requests: {b.max_running_requests} ({binding})")
    for c in b.caps:
        lines.append(f"    {c.kind:<12}{c.value:>8,}  {c.reason}")
    if b.overcommitted:
        lines.append("    note: more running requests than full-context KV holds; decode may "
                     "preempt (and recompute) when pages run out")
    return "\n".join(lines)


def _full_spec(latent: torch.dtype, recurrent: torch.dtype, draft_bytes: int = 0) -> CacheFootprint:
    dtypes = CacheDtypes(latent=latent, pool_keys=torch.float8_e4m3fn, recurrent=recurrent,
                         conv=torch.bfloat16, tail=torch.bfloat16)
    spec = CacheFootprint.of(preset_config("full"), dtypes, tp=4, with_mtp=False)
    return dataclasses.replace(spec, draft_bytes_per_token=draft_bytes)


def seed_baseline() -> BudgetInputs:
    """Isolated decode baseline: BF16 KV, FP32 state, 56 running, 56 state slots."""
    spec = _full_spec(torch.bfloat16, torch.float32)
    pools = 46.72 * GIB + 1.96 * GIB  # the seed's KV + state pools
    return BudgetInputs(footprint=spec, context_len=SEED_CONTEXT, byte_budget=int(pools),
                        max_running_requests=56, state_slots=56, label="seed decode baseline, TP4")


def seed_final(slots_per_request: int = 3) -> BudgetInputs:
    """Optimised decode: FP8 KV + BF16 draft KV, BF16 state, 414 slots for 132 running + 6 in
    flight (SGLang keeps 3 slots per request with its radix cache on; glmlab's ``kv_only`` tree
    keeps no state, so ``slots_per_request=1`` shows what that would free)."""
    spec = _full_spec(torch.float8_e4m3fn, torch.bfloat16, SEED_DRAFT_BYTES_PER_TOKEN)
    pools = (14.00 + 11.96 + 7.37) * GIB
    slots = 414 if slots_per_request == 3 else slots_per_request * (132 + 6)
    return BudgetInputs(footprint=spec, context_len=SEED_CONTEXT, byte_budget=int(pools),
                        max_running_requests=132, state_slots=slots, extra_slots=6,
                        slots_per_request=slots_per_request, shared_prefix_len=SEED_SHARED_PREFIX,
                        label=f"seed decode final, TP4, {slots_per_request} state slot(s)/request")


# The seed's per-GPU decode memory (docs/reference-numbers.md section 0), GiB, beside what
# plan_budget derives.
SEED_POOLS = {"baseline": {"target KV": 46.72, "recurrent + conv state": 1.96, "state slots": 56},
              "final": {"target KV": 14.00, "draft KV": 11.96, "recurrent + conv state": 7.37,
                        "state slots": 414}}


def seed_comparison_rows() -> list[dict]:
    """One row per (configuration, pool): the seed's figure and glmlab's."""
    rows = []
    for name, inputs in (("baseline", seed_baseline()), ("final", seed_final())):
        b = plan_budget(inputs)
        ours = {"target KV": b.kv_bytes / GIB, "draft KV": b.draft_kv_bytes / GIB,
                "recurrent + conv state": b.state_bytes / GIB,
                "state slots": b.num_state_slots - 1}
        for pool, seed in SEED_POOLS[name].items():
            rows.append(dict(config=name, pool=pool, seed=seed, glmlab=round(ours[pool], 2),
                             max_running=b.max_running_requests))
    return rows
