"""Run the same requests through one engine and through a TP engine, so they can be compared.

A ``DecodeCase`` is a batch of prompts of mixed lengths (optionally sharing a prefix) that
arrive in two waves, so steps mix prefill chunks with decodes. ``drive`` runs it through any
engine-like object and returns each request's output ids and the logits its tokens were sampled
from (with ``LogitsEngine``). ``tp_decode_runs`` is the per-rank entry for ``parallel.launch``:
rank 0 of the TP group drives a ``LeaderEngine``, the others ``follow``; every rank returns what
its own engine produced and whether its pools are empty afterwards. Used by the tests and
``glmlab dist --tp``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from glmlab.cache.footprint import CacheFootprint, cache_dtypes
from glmlab.config import ModelConfig
from glmlab.core import Req, Sampled, SamplingParams
from glmlab.distributed.engine_tp import Channel, LeaderEngine, follow, tp_engine
from glmlab.distributed.parallel import ParallelLayout, ProcessGroups
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class DecodeCase:
    prompt_lens: tuple[int, ...] = (37, 5, 20, 64)
    max_new_tokens: int = 6
    shared_prefix_len: int = 0  # every prompt starts with the same tokens (radix reuse)
    first_wave: int = 2  # prompts queued at the start; the rest after ``wave_gap`` steps
    wave_gap: int = 2
    seed: int = 0
    temperature: float = 0.0  # 0 = greedy; else sampled with the engine's seeded generators

    def prompts(self, vocab_size: int) -> list[list[int]]:
        gen = torch.Generator().manual_seed(self.seed)
        prefix = torch.randint(0, vocab_size, (self.shared_prefix_len,), generator=gen).tolist()
        return [prefix + torch.randint(0, vocab_size, (n,), generator=gen).tolist()
                for n in self.prompt_lens]


class LogitsEngine(Engine):
    """An ``Engine`` that keeps the fp32 logits each plain (non-speculative) token came from."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampled_logits: dict[str, list[torch.Tensor]] = {}

    def sample(self, reqs: list[Req], logits: torch.Tensor) -> list[Sampled]:
        for req, row in zip(reqs, logits, strict=True):
            self.sampled_logits.setdefault(req.rid, []).append(row.float().cpu())
        return super().sample(reqs, logits)


@dataclass
class CaseResult:
    outputs: list[list[int]]  # per prompt, in order
    logits: list[torch.Tensor | None]  # per prompt: [num sampled, V] fp32, if recorded
    steps: int
    idle: bool  # every page and state slot back (free or evictable tree content)
    budget: dict = field(default_factory=dict)


def drive(engine, case: DecodeCase, vocab_size: int) -> tuple[list[str], int]:
    """Queue the case in two waves and step until done; returns the request ids and steps."""
    params = SamplingParams(temperature=case.temperature, max_new_tokens=case.max_new_tokens,
                            ignore_eos=True)
    prompts = case.prompts(vocab_size)
    rids = [engine.add_request(p, params) for p in prompts[:case.first_wave]]
    steps = 0
    while engine.has_work:
        engine.step()
        steps += 1
        if steps == case.wave_gap:
            rids += [engine.add_request(p, params) for p in prompts[case.first_wave:]]
    if len(rids) < len(prompts):  # finished before the gap: queue the rest now
        rids += [engine.add_request(p, params) for p in prompts[len(rids):]]
        while engine.has_work:
            engine.step()
            steps += 1
    return rids, steps


def result_of(engine: Engine, rids: list[str], steps: int) -> CaseResult:
    logits = getattr(engine, "sampled_logits", {})
    out = CaseResult([list(engine.request(r).output_ids) for r in rids],
                     [torch.stack(logits[r]) if logits.get(r) else None for r in rids], steps,
                     _idle(engine), budget_facts(engine))
    return out


def _idle(engine: Engine) -> bool:
    return not engine.leaks()


def budget_facts(engine: Engine) -> dict:
    """What this engine allocated: pool sizes and the bytes one token / state slot costs."""
    storage, b = engine.cache.storage, engine.budget
    return {"num_pages": b.num_pages, "num_state_slots": b.num_state_slots,
            "max_running_requests": b.max_running_requests,
            "state_bytes_per_slot": storage.state_bytes_per_slot(),
            "kv_bytes_per_token": storage.bytes_per_token(),
            "budget_state_bytes_per_slot": b.inputs.footprint.state_bytes_per_slot,
            "budget_kv_bytes_per_token": b.inputs.footprint.kv_bytes_per_token,
            "cached_tokens": engine.cache.stats.cached_tokens}


def expected_budget(full: ModelConfig, cfg: EngineConfig, dtype: torch.dtype, tp: int,
                    with_mtp: bool) -> CacheFootprint:
    """What ``glmlab.cache.budget`` says one GPU of a TP-``tp`` engine holds per token / slot."""
    return CacheFootprint.of(full, cache_dtypes(cfg, dtype), tp=tp, with_mtp=with_mtp)


def single_run(path: str, dtype: str, options: dict, case: DecodeCase,
               device: str = "cpu") -> CaseResult:
    """The reference: one process, the untransformed model."""
    engine = LogitsEngine.from_pretrained(
        path, EngineConfig(device=device, dtype=dtype, print_budget=False, **options))
    rids, steps = drive(engine, case, engine.model.cfg.vocab_size)
    return result_of(engine, rids, steps)


def tp_decode_runs(path: str, dtype: str, layout: ParallelLayout,
                   runs: list[tuple[dict, DecodeCase]]) -> list[CaseResult]:
    """Per-rank entry for ``parallel.launch``: each run loads the checkpoint, shards it, builds an
    engine with ``EngineConfig(**options)``; rank 0 of the TP group leads, the others follow."""
    nccl = dist.get_backend() == "nccl"
    device = f"cuda:{torch.cuda.current_device()}" if nccl else "cpu"
    groups = ProcessGroups.build(layout)
    channel = Channel(groups)
    out = []
    for options, case in runs:
        cfg = EngineConfig(device=device, dtype=dtype, print_budget=False, **options)
        engine = tp_engine(path, cfg, groups, LogitsEngine)
        if groups.info.tp_rank == 0:
            leader = LeaderEngine(engine, channel)
            rids, steps = drive(leader, case, engine.model.cfg.vocab_size)
            leader.close()
        else:
            stats = follow(engine, channel)
            rids, steps = stats.added, stats.steps
        out.append(result_of(engine, rids, steps))
    return out
