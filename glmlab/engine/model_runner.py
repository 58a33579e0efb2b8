"""ModelRunner: an ``EngineConfig`` and a checkpoint in, a model with its caches that runs steps.

The one place that
- loads a checkpoint for a config (``load_model_for``: compute dtype, block-FP8 weights kept for
  the kernels or dequantised for the reference, device) and binds the op backends by name, once;
- sizes the pools from the memory budget (``glmlab.cache.budget``) and allocates them;
- builds a step's plan (``plan`` from the scheduler's entries; ``forward_plan`` over any rows of
  the pools, which speculative verify windows use too): the flat input ids, the ``ForwardPlan``
  (sequence and cached lengths, state slots, page table -> token slots), the rows whose logits
  are read. Every tensor is built here from host lists, one copy to the device each;
- runs the model: ``forward(plan)`` is the single forward call of the engine, plain and
  speculative steps alike (CUDA graphs will be captured and replayed behind it);
- samples, with logprobs for the requests that ask.

Padding the page table uses page 0, the pools' reserved scratch page, which no request owns.
The runner knows nothing about scheduling, requests' lifetimes or text.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from glmlab.cache.budget import Budget, BudgetInputs, plan_budget
from glmlab.cache.footprint import CacheFootprint, cache_dtypes
from glmlab.cache.hybrid import HybridCache
from glmlab.cache.storage import ModelCache
from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.presets_dir import resolve_model
from glmlab.core import RadixMode, Req, Sampled
from glmlab.engine.config import EngineConfig
from glmlab.engine.cuda_graph import make_graph_runner, planned_reserve, replay_ready
from glmlab.model.backends import LOGPROBS, PENALTIES, RACE, TOKEN_MASK
from glmlab.model.glm import GLM5Model
from glmlab.model.plan import ForwardPlan, StepPlan, StepResult, VerifyRecorder
from glmlab.model.session import run_step
from glmlab.sampling import BatchSampler
from glmlab.speculative.engine_phase import load_spec_draft, spec_budget

CPU_CACHE_BYTES = 256 << 20  # a CPU has no device memory to take a fraction of


def load_model_for(path: str | Path, cfg: EngineConfig) -> GLM5Model:
    """A checkpoint directory or preset name (``tiny``, ``slice:N``), loaded as ``cfg`` asks."""
    return load_model(resolve_model(str(path)), dtype=cfg.model_dtype, device=cfg.device,
                      fp8=cfg.fp8_weights.value)


class ModelRunner:
    def __init__(self, model: GLM5Model, cfg: EngineConfig | None = None):
        self.cfg = cfg = cfg or EngineConfig()
        self.model = model.use_backends(cfg.backends)
        self.device = model.embed_tokens.weight.device
        spec = cfg.speculative
        self.draft = load_spec_draft(model, spec) if spec else None  # resident before the budget
        inputs = replace(budget_inputs(cfg, model), graph_bytes=planned_reserve(model, cfg))
        if spec:
            inputs = spec_budget(inputs, model, spec, self.draft,
                                 cache_dtypes(cfg, model.dtype).recurrent)
        self.budget: Budget = plan_budget(inputs)
        storage = ModelCache(model.cfg, self.budget.num_pages * cfg.page_size,
                             self.budget.num_state_slots, cfg.page_size,
                             cache_dtypes(cfg, model.dtype), self.device,
                             with_mtp=model.mtp is not None)
        self.cache = HybridCache(storage, cfg.radix)
        self.page_size = cfg.page_size
        self.sampler = BatchSampler(model.cfg.vocab_size, self.device,
                                    PENALTIES.get(cfg.backends.sampling),
                                    TOKEN_MASK.get(cfg.backends.sampling),
                                    RACE.get(cfg.backends.sampling),
                                    LOGPROBS.get(cfg.backends.sampling))
        self.graphs = make_graph_runner(model, storage, cfg)  # issue 15: None when not usable
        if cfg.print_budget:
            print(self.budget.table(), file=sys.stderr)

    @classmethod
    def from_pretrained(cls, path: str | Path, cfg: EngineConfig | None = None) -> ModelRunner:
        cfg = cfg or EngineConfig()
        return cls(load_model_for(path, cfg), cfg)

    # ------------------------------------------------------------------ plans
    def plan(self, entries: Sequence, capture_layers: tuple[int, ...] = ()) -> StepPlan:
        """The step of the scheduler's ``entries``: logits at the last row of sampling ones."""
        ids, rows, end = [], [], 0
        for e in entries:
            ids.extend(e.req.token_ids[e.start:e.start + e.num_tokens])
            end += e.num_tokens
            if e.samples:
                rows.append(end - 1)
        forward = self.forward_plan([e.req.cache.pages for e in entries],
                                    [e.num_tokens for e in entries], [e.start for e in entries],
                                    [e.req.cache.slot for e in entries])
        dev = self.device
        return StepPlan(torch.tensor(ids, dtype=torch.long, device=dev), forward,
                        torch.tensor(rows, dtype=torch.long, device=dev), capture_layers)

    def forward_plan(self, pages: Sequence[Sequence[int]], seq_lens: Sequence[int],
                     cache_lens: Sequence[int], slots: Sequence[int],
                     verify: VerifyRecorder | None = None) -> ForwardPlan:
        """Sequence i: ``seq_lens[i]`` new tokens after ``cache_lens[i]`` cached ones, in the
        leased ``pages[i]`` and state slot ``slots[i]``."""
        need = [self.cache.pages_for(c + n) for n, c in zip(seq_lens, cache_lens, strict=True)]
        width = max(need)
        table = []
        for own, k, slot in zip(pages, need, slots, strict=True):
            if len(own) < k:
                raise ValueError(f"state slot {slot}: {k} pages needed, the lease holds "
                                 f"{len(own)}")
            table.append(list(own[:k]) + [0] * (width - k))
        return ForwardPlan.build(list(seq_lens), list(cache_lens), list(slots),
                                 torch.tensor(table, dtype=torch.long, device=self.device),
                                 self.page_size, verify=verify)

    # ------------------------------------------------------------------ run
    def forward(self, plan: StepPlan) -> StepResult:
        """The model over one step's plan. The engine's only forward call."""
        if self.graphs is not None and replay_ready(self.graphs, plan):
            return self.graphs.run(plan)
        return run_step(self.model, self.cache.storage, plan)

    def sample(self, reqs: Sequence[Req], logits: torch.Tensor) -> list[Sampled]:
        """One token per request from its row of fp32 logits (penalties, bias, grammar masks,
        seeded draws: ``glmlab.sampling``); logprobs where asked."""
        return self.sampler.sample(reqs, logits)


def budget_inputs(cfg: EngineConfig, model: GLM5Model) -> BudgetInputs:
    """What the budget needs to know about this engine: formats, context, memory, limits."""
    footprint = CacheFootprint.of(model.cfg, cache_dtypes(cfg, model.dtype),
                                  with_mtp=model.mtp is not None)
    device = model.embed_tokens.weight.device
    byte_budget, device_bytes, weight_bytes = cfg.cache_bytes, None, 0
    if byte_budget is None and device.type == "cuda":
        free, device_bytes = torch.cuda.mem_get_info(device)
        weight_bytes = device_bytes - free  # weights, CUDA context, anything already resident
    elif byte_budget is None:
        byte_budget = CPU_CACHE_BYTES
    return BudgetInputs(
        footprint=footprint, context_len=cfg.context_len or model.cfg.max_position_embeddings,
        page_size=cfg.page_size, byte_budget=byte_budget, device_bytes=device_bytes,
        mem_fraction=cfg.mem_fraction, weight_bytes=weight_bytes,
        max_running_requests=cfg.max_running_requests, state_slots=cfg.state_slots,
        extra_slots=cfg.extra_slots,
        slots_per_request=3 if cfg.radix is RadixMode.KV_AND_STATE else 1,
        max_pages=cfg.max_pages, label="engine")
