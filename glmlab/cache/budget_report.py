"""How a budget is shown (the table ``glmlab budget`` and the engine print), and the reference
deployment's two decode configurations, derived (docs/reference-numbers.md section 0,
docs/techniques.md sections 2 and 3.2).

The reference deployment is the published SGLang GLM-5.3-Flash service on 4 x H200 (TP4/EP4
decode). Its scenarios here take only what that deployment *chose* (device, static memory
fraction, running-request limit, state slots, KV / state / draft-KV dtypes, context and shared
prefix) and derive every pool from the model shape and dtypes: weight bytes per GPU from the
checkpoint layout, the static budget as device x fraction - weights (SGLang's rule, without its
runtime reserve for CUDA graphs and activations, which is not published), the ReplaySSM ring that
SGLang's planner charges per state slot, state per slot, KV per token. The deployment's published
pool sizes (``REFERENCE_POOLS``) are what the derivation is checked against, never an input.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from glmlab.cache.budget import GIB, Budget, BudgetInputs, plan_budget
from glmlab.cache.footprint import CacheFootprint
from glmlab.cache.storage import CacheDtypes
from glmlab.checkpoint.writer import fp8_parameter_names, stored_in_fp32
from glmlab.config import ModelConfig
from glmlab.model.glm import GLM5Model
from glmlab.presets import preset_config

REFERENCE_CONTEXT = 65_536 + 1_024  # 64K prompt + 1K output
REFERENCE_SHARED_PREFIX = 65_472  # decode benchmark: 99.9% shared prefix (docs/techniques.md 3.3)
H200_BYTES = 143_771 * 2**20  # one H200 as nvidia-smi reports it (docs/platform.md section 1)
REFERENCE_TP = 4
# The DFlash2 draft's config is not public (docs/techniques.md section 9): glmlab's real-width
# draft shape (glmlab.speculative.dflash_io.draft_shape: 8 KV heads x 128, 5 layers, BF16) split
# over TP4 gives 2 KV heads x (128 + 128) x 5 layers x 2 B per token and rank.
REFERENCE_DRAFT_BYTES_PER_TOKEN = 2 * (128 + 128) * 5 * 2
REPLAY_RING_LEN = 16  # --linear-replayssm-cache-len default


@functools.lru_cache(maxsize=16)
def weight_bytes(cfg: ModelConfig, tp: int = 1, with_mtp: bool = False) -> int:
    """Checkpoint bytes of the text model per GPU (every tensor split over ``tp`` ranks): block-FP8
    weights (1 B + one fp32 scale per 128 x 128 block) where the release stores them, fp32 where
    it keeps fp32, bf16 elsewhere. For the full model with MTP and tp=1 this is the published
    checkpoint's text size (docs/model.md section 4), to the byte."""
    with torch.device("meta"):
        model = GLM5Model(cfg, with_mtp=with_mtp)
    fp8 = fp8_parameter_names(model) if cfg.fp8 else set()
    block = cfg.fp8.block if cfg.fp8 else (128, 128)
    total = 0
    for name, p in model.named_parameters():
        if name in fp8:
            *lead, rows, cols = p.shape
            blocks = math.prod(lead) * math.ceil(rows / block[0]) * math.ceil(cols / block[1])
            total += p.numel() + 4 * blocks
        else:
            total += p.numel() * (4 if stored_in_fp32(name) else 2)
    return total // tp


def replayssm_ring_bytes(cfg: ModelConfig, tp: int, act_bytes: int = 2,
                         ring_len: int = REPLAY_RING_LEN) -> int:
    """Bytes SGLang's planner charges per state slot for the ReplaySSM ring (raw v, raw k, FP32 g
    and beta, and the decode ring's d / k) over all KDA layers (docs/techniques.md section 2)."""
    heads, k, v = cfg.kda.num_heads // tp, cfg.kda.head_dim, cfg.kda.head_dim
    per_layer = ring_len * heads * (v * act_bytes + k * act_bytes + 4 + k * 4
                                    + v * act_bytes + k * act_bytes)
    return len(cfg.kda_layers) * per_layer


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
    if x.graph_bytes:
        lines.append(f"  set aside for CUDA graphs (estimated, outside the pools): "
                     f"{x.graph_bytes / GIB:.2f} GiB")
    binding = " = ".join(c.kind for c in b.binding)
    lines.append(f"  max running requests: {b.max_running_requests} ({binding})")
    for c in b.caps:
        lines.append(f"    {c.kind:<12}{c.value:>8,}  {c.reason}")
    if b.overcommitted:
        lines.append("    note: more running requests than full-context KV holds; decode may "
                     "preempt (and recompute) when pages run out")
    return "\n".join(lines)


def _full_footprint(latent: torch.dtype, recurrent: torch.dtype,
                    draft_bytes: int = 0) -> CacheFootprint:
    dtypes = CacheDtypes(latent=latent, pool_keys=torch.float8_e4m3fn, recurrent=recurrent,
                         conv=torch.bfloat16, tail=torch.bfloat16)
    footprint = CacheFootprint.of(preset_config("full"), dtypes, tp=REFERENCE_TP, with_mtp=False)
    return dataclasses.replace(footprint, draft_bytes_per_token=draft_bytes)


def reference_baseline() -> BudgetInputs:
    """Isolated decode baseline: BF16 KV, FP32 state, static fraction 0.90, 56 running requests
    and 56 state slots; the pools follow from the device and the weights."""
    cfg = preset_config("full")
    return BudgetInputs(footprint=_full_footprint(torch.bfloat16, torch.float32),
                        context_len=REFERENCE_CONTEXT, device_bytes=H200_BYTES, mem_fraction=0.90,
                        weight_bytes=weight_bytes(cfg, REFERENCE_TP), max_running_requests=56,
                        state_slots=56, label="reference decode baseline, TP4")


def reference_final(slots_per_request: int = 3) -> BudgetInputs:
    """Optimised decode: FP8 KV + BF16 draft KV, BF16 state, fraction 0.84, ReplaySSM ring per
    state slot, 414 slots for 132 running + 6 in flight (SGLang keeps 3 slots per request with its
    radix cache on; glmlab's ``kv_only`` tree keeps no state, so ``slots_per_request=1`` shows what
    that would free)."""
    cfg = preset_config("full")
    slots = 414 if slots_per_request == 3 else slots_per_request * (132 + 6)
    return BudgetInputs(
        footprint=_full_footprint(torch.float8_e4m3fn, torch.bfloat16,
                                  REFERENCE_DRAFT_BYTES_PER_TOKEN),
        context_len=REFERENCE_CONTEXT, device_bytes=H200_BYTES, mem_fraction=0.84,
        weight_bytes=weight_bytes(cfg, REFERENCE_TP), max_running_requests=132,
        state_slots=slots, extra_slots=6, slots_per_request=slots_per_request,
        spec_slots=slots + 1, spec_bytes_per_slot=replayssm_ring_bytes(cfg, REFERENCE_TP),
        shared_prefix_len=REFERENCE_SHARED_PREFIX,
        label=f"reference decode final, TP4, {slots_per_request} state slot(s)/request")


# The reference deployment's published per-GPU decode memory (docs/reference-numbers.md
# section 0), GiB ("GB" in the post): what the derivation above is compared with.
REFERENCE_POOLS = {
    "baseline": {"target KV": 46.72, "recurrent + conv state": 1.96, "state slots": 56},
    "final": {"target KV": 14.00, "draft KV": 11.96, "recurrent + conv state": 7.37,
              "state slots": 414},
}


def reference_comparison_rows() -> list[dict]:
    """One row per (configuration, pool): the reference deployment's figure and glmlab's."""
    rows = []
    for name, inputs in (("baseline", reference_baseline()), ("final", reference_final())):
        b = plan_budget(inputs)
        ours = {"target KV": b.kv_bytes / GIB, "draft KV": b.draft_kv_bytes / GIB,
                "recurrent + conv state": b.state_bytes / GIB,
                "state slots": b.num_state_slots - 1}
        for pool, ref in REFERENCE_POOLS[name].items():
            rows.append(dict(config=name, pool=pool, reference=ref, glmlab=round(ours[pool], 2),
                             max_running=b.max_running_requests))
    return rows
