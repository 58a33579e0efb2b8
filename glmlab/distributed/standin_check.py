"""The same steps on real ranks (torch.distributed) and on one stand-in rank, for comparisons.

``run_case`` runs three small steps on the random model of a preset: a TP/EP engine step (one
prompt prefilled while another decodes, then the MTP layer over those rows), a TP DFlash2 draft
forward over stored context K/V, and an interleaved CP prefill. ``real_rank`` runs it on a rank of
a ``launch``ed group and observes what the process group really did with the torch profiler (the
``c10d::`` ops and their tensor shapes and dtypes: what gloo / NCCL were asked to move),
independently of any recorder; ``standin_rank`` runs it on one process with ``StandInGroup``s and
returns what its recorder saw. Tests compare the two lists, and the draft's output on real ranks
against the unsplit draft's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from glmlab.cache.storage import CacheDtypes, ModelCache
from glmlab.distributed.draft_tp import shard_draft
from glmlab.distributed.parallel import ParallelLayout, ProcessGroups
from glmlab.distributed.random_shard import random_cp_prefill, random_tp_model
from glmlab.distributed.standin import CollectiveRecorder, emulated_groups
from glmlab.model.plan import ForwardPlan, StepPlan
from glmlab.model.session import run_step
from glmlab.presets import preset, preset_config
from glmlab.speculative import dflash
from glmlab.speculative.dflash import DFlashDraftModel
from glmlab.speculative.dflash_io import init_random_draft_, random_draft_config
from glmlab.speculative.draft_kv import DraftKVLayout, DraftKVStore

_SIZES = {"float32": 4, "float": 4, "c10::BFloat16": 2, "bfloat16": 2, "c10::Half": 2,
          "int": 4, "long int": 8, "int64": 8, "int32": 4, "unsigned char": 1}


def unsplit_draft(name: str = "tiny", seed: int = 0) -> DFlashDraftModel:
    """The tiny target's random DFlash2 draft with 2 KV heads (so that TP2 splits them)."""
    cfg = random_draft_config(preset_config(name), block_size=4, num_layers=2)
    import dataclasses
    cfg = dataclasses.replace(cfg, num_kv_heads=2)
    with torch.device("cpu"):
        draft = DFlashDraftModel(cfg)
    return init_random_draft_(draft, seed).eval()


def draft_inputs(draft: DFlashDraftModel, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    c, n, ctx = draft.cfg, 2, 9
    return {"features": torch.randn(ctx, len(c.target_layer_ids) * c.hidden_size, generator=g),
            "x": torch.randn(n, c.block_size, c.hidden_size, generator=g),
            "positions": ctx + torch.arange(c.block_size).repeat(n, 1),
            "slots": torch.stack([torch.arange(ctx), torch.arange(ctx).masked_fill(
                torch.arange(ctx) >= 6, -1)])}


@torch.inference_mode()
def draft_forward(draft: DFlashDraftModel, inputs: dict) -> torch.Tensor:
    """Store the context K/V of ``inputs`` and run the draft over the block (one request per
    chunk, so the chunked context read is exercised)."""
    c = draft.cfg
    store = DraftKVStore(DraftKVLayout(c.num_layers, c.num_kv_heads, c.head_dim, "bf16"), 16)
    ctx = inputs["features"].shape[0]
    for i, (k, v) in enumerate(draft.context_kv(inputs["features"], torch.arange(ctx))):
        store.write(i, torch.arange(ctx), k, v)
    before, dflash.CONTEXT_ROWS_PER_CHUNK = dflash.CONTEXT_ROWS_PER_CHUNK, ctx
    try:
        return draft(inputs["x"], inputs["positions"], store, inputs["slots"])
    finally:
        dflash.CONTEXT_ROWS_PER_CHUNK = before


@torch.inference_mode()
def run_case(groups: ProcessGroups, name: str = "tiny") -> torch.Tensor:
    """The three steps on this rank; returns the TP draft's output [N, B, D]."""
    info = groups.info
    tp = ProcessGroups(info, tp=groups.tp, ep=groups.ep)
    model = random_tp_model(preset(name), tp, seed=0, fp8=True, fp8_mode="dequantize",
                            dtype=torch.float32)
    cache = ModelCache(model.cfg, 4 * 64, 4, 64, CacheDtypes.like(torch.float32), "cpu")
    plan = ForwardPlan.build([5, 1], [0, 7], [1, 2], torch.tensor([[1], [2]]), 64)
    res = run_step(model, cache, StepPlan(torch.arange(6), plan))
    model.mtp_forward(res.hidden, torch.arange(6) + 1, plan, cache)
    draft = shard_draft(unsplit_draft(name), info.tp_rank, info.tp_size, groups.tp)
    out = draft_forward(draft, draft_inputs(draft))
    cp = random_cp_prefill(preset(name), groups, seed=0, fp8=True, fp8_mode="dequantize",
                           dtype=torch.float32)
    cp_cache = cp.new_cache(64, 1, 64)
    cp.forward(torch.arange(24), ForwardPlan.build([24], [0], [0], torch.tensor([[0]]), 64),
               cp_cache)
    return out


def profiled_collectives(fn) -> tuple[list[tuple[str, int]], object]:
    """(kind, bytes) of every collective ``fn()`` asked the process group for, in order, read
    from the profiler's ``c10d::`` ops (bytes as nccl-tests counts them); and fn's result."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                record_shapes=True) as prof:
        result = fn()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    calls, pending = [], None
    for e in events:
        name = e.name
        if name.startswith("c10d::allreduce"):
            pending = "all_reduce"  # its tensors are a list: the backend's event has the shape
        elif pending and name.startswith(("gloo:", "nccl:")) and e.input_shapes:
            calls.append((pending, _bytes(e.input_shapes[0], e.input_dtypes[0])))
            pending = None
        elif "allgather_base" in name or "all_gather_single" in name:
            calls.append(("all_gather", _bytes(e.input_shapes[0], e.input_dtypes[0])))
        elif "reduce_scatter_base" in name or "reduce_scatter_single" in name:
            calls.append(("reduce_scatter", _bytes(e.input_shapes[1], e.input_dtypes[1])))
    return calls, result


def _bytes(shape, dtype: str) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * _SIZES[dtype]


def real_rank(layout: ParallelLayout, name: str = "tiny") -> dict:
    """On a launched rank: the case over real groups, and what the profiler saw them move."""
    groups = ProcessGroups.build(layout)
    calls, out = profiled_collectives(lambda: run_case(groups, name))
    return {"rank": dist.get_rank(), "calls": calls, "draft_out": out}


def standin_rank(layout: ParallelLayout, rank: int, name: str = "tiny") -> list[tuple[str, int]]:
    """The case on one process as rank ``rank``; what its recorder saw, as (kind, bytes)."""
    rec = CollectiveRecorder()
    run_case(emulated_groups(layout, rank, rec), name)
    return [(c.kind, c.bytes) for c in rec.calls]
