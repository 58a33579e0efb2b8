"""Engine: continuous batching of GLM-5.3-Flash over a hybrid cache, one ``step()`` at a time.

    batch  = scheduler.schedule()        which requests, how many tokens each (no tensors)
    plan   = runner.plan(batch)          per-step metadata, built once
    logits = runner.forward(plan)        the model over the flat batch
    tokens = sampler(batch, logits)      one token per sampling entry
    outs   = scheduler.update(batch, tokens)

At construction the memory budget (``glmlab.cache.budget``) sizes the pools from ``EngineConfig``
and is printed. Notebooks, ``LLM``, benchmarks and the serving workers all drive this class; a
prefill/decode instance uses the same loop with ``hold_after_prefill`` / ``imported`` requests
and ``CacheTarget`` to find what to transfer. The engine knows nothing about HTTP or transfers.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable, Sequence

import torch

from glmlab.cache.budget import Budget, BudgetInputs, plan_budget
from glmlab.cache.hybrid import HybridCache
from glmlab.cache.spec import CacheSpec, cache_dtypes
from glmlab.cache.storage import ModelCache
from glmlab.engine.config import EngineConfig, RadixMode
from glmlab.engine.runner import Runner
from glmlab.engine.sampler import SamplingParams, make_generator, sample_batch
from glmlab.engine.scheduler import Scheduler
from glmlab.engine.types import Batch, CacheTarget, Req, Status, StepOutput
from glmlab.model.glm import GLM5Model
from glmlab.speculative.engine_phase import SpecPhase, load_spec_draft, spec_budget
from glmlab.trace.tracer import NULL_TRACER, Tracer

CPU_CACHE_BYTES = 256 << 20  # a CPU has no device memory to take a fraction of


class Engine:
    def __init__(self, model: GLM5Model, cfg: EngineConfig | None = None,
                 detokenize: Callable[[list[int]], str] | None = None,
                 eos_token_ids: Sequence[int] = (), tracer: Tracer = NULL_TRACER):
        self.model, self.cfg = model, cfg or EngineConfig()
        spec = self.cfg.speculative
        draft = load_spec_draft(model, spec) if spec else None  # resident before the budget
        inputs = budget_inputs(self.cfg, model)
        if spec:
            dtypes = cache_dtypes(self.cfg, model.dtype)
            inputs = spec_budget(inputs, model, spec, draft, dtypes.recurrent)
        self.budget: Budget = plan_budget(inputs)
        storage = ModelCache(model.cfg, self.budget.num_pages * self.cfg.page_size,
                             self.budget.num_state_slots, self.cfg.page_size,
                             cache_dtypes(self.cfg, model.dtype), _device(model),
                             with_mtp=model.mtp is not None)
        self.cache = HybridCache(storage, self.cfg.radix)
        self.context_len = self.budget.inputs.context_len
        self.spec = SpecPhase(model, self.cache, spec, self.budget.inputs.spec_slots, draft,
                              self.cfg.seed, tracer) if spec else None
        self.scheduler = Scheduler(self.cfg, self.cache, self.budget.max_running_requests,
                                   detokenize, tracer,
                                   verify_width=self.spec.verify_width if self.spec else None)
        self.runner = Runner(model, self.cache)
        self.detokenize, self.tracer = detokenize, tracer
        self.eos_token_ids = tuple(eos_token_ids or model.cfg.eos_token_ids)
        self._ids = itertools.count()
        self._requests: dict[str, Req] = {}
        if self.cfg.print_budget:
            print(self.budget.table(), file=sys.stderr)

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[StepOutput]:
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        start = time.perf_counter_ns()
        tokens = self.execute(batch)
        outputs = self.scheduler.update(batch, tokens)
        self.tracer.on_step(batch, self.cache.usage, start, time.perf_counter_ns())
        return outputs

    def execute(self, batch: Batch) -> list:
        """The batch's forward and sampling: one token per sampling entry, or with speculation
        the emitted tokens of each VERIFY entry (``glmlab.speculative.engine_phase``)."""
        if self.spec is not None:
            return self.spec.execute(batch, self.scheduler.running)
        return self.sample(batch, self.runner.forward(self.runner.plan(batch)))

    def sample(self, batch: Batch, logits: torch.Tensor) -> list[int]:
        reqs = [e.req for e in batch.entries if e.samples]
        return sample_batch(logits, [r.params for r in reqs], [r.generator for r in reqs])

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                    rid: str | None = None, imported: bool = False,
                    hold_after_prefill: bool = False) -> str:
        """Queue a request; returns its id. ``imported``: its prompt's cache content will be
        written from outside (see ``import_targets``); ``hold_after_prefill``: keep its cache
        after the first token for export (``export_target``, then ``release_held``)."""
        params = params or SamplingParams()
        req = self._new_request(list(prompt_ids), params, rid)
        req.imported, req.hold_after_prefill = imported, hold_after_prefill
        self._requests[req.rid] = req
        self.scheduler.add(req)
        return req.rid

    def _new_request(self, ids: list[int], params: SamplingParams, rid: str | None) -> Req:
        n = next(self._ids)
        rid = rid if rid is not None else f"r{n}"
        if rid in self._requests and self._requests[rid].status is not Status.FINISHED:
            raise ValueError(f"request id {rid!r} is already in use")
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.model.cfg.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            bad = [t for t in ids if not 0 <= t < vocab][:5]
            raise ValueError(f"token ids must be in [0, {vocab}): {bad}")
        if len(ids) >= self.context_len:
            raise ValueError(f"the prompt has {len(ids)} tokens; the context holds "
                             f"{self.context_len} (prompt plus at least one output token)")
        if params.stop and self.detokenize is None:
            raise ValueError("stop strings need a tokenizer (pass detokenize=...)")
        max_len = min(len(ids) + params.max_new_tokens, self.context_len)
        if self.cache.pages_for(max_len) > self.cache.pages.capacity:
            raise ValueError(f"a request of {max_len} tokens needs more KV pages than the pool "
                             f"holds ({self.cache.pages.capacity})")
        stop = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop |= set(self.eos_token_ids)
        gen = make_generator(params, _device(self.model))
        if gen is not None and params.seed is None:  # reproducible: derive from the engine seed
            gen.manual_seed(self.cfg.seed * 1_000_003 + n)
        return Req(rid, ids, len(ids), params, max_len, frozenset(stop), gen)

    def abort(self, rid: str) -> StepOutput | None:
        out = self.scheduler.abort(rid)
        if self.spec is not None:
            self.spec.release(rid)
        return out

    def request(self, rid: str) -> Req:
        return self._requests[rid]

    def forget(self, rid: str) -> None:
        """Drop a finished request's record (long-running servers)."""
        if self._requests[rid].status is Status.FINISHED:
            del self._requests[rid]

    # ------------------------------------------------------------------ PD seams
    def import_targets(self) -> list[CacheTarget]:
        """Admitted imported requests whose cache content is still to be written."""
        return [self._target(r) for r in self.scheduler.parked.values()
                if r.status is Status.AWAITING_IMPORT]

    def complete_import(self, rid: str, first_token: int) -> StepOutput:
        return self.scheduler.complete_import(rid, first_token)

    def export_target(self, rid: str) -> CacheTarget:
        req = self.scheduler.parked.get(rid)
        if req is None or req.status is not Status.HELD:
            raise ValueError(f"request {rid!r} is not held after prefill")
        return self._target(req)

    def release_held(self, rid: str) -> None:
        self.scheduler.release_held(rid)

    def _target(self, req: Req) -> CacheTarget:
        pages = self.cache.pages_for(req.num_prompt)
        return CacheTarget(req.rid, req.num_prompt, req.cache.prefix_len,
                           tuple(req.cache.pages[:pages]), req.cache.slot, self.cfg.page_size)


def _device(model: GLM5Model) -> torch.device:
    return model.embed_tokens.weight.device


def budget_inputs(cfg: EngineConfig, model: GLM5Model) -> BudgetInputs:
    """What the budget needs to know about this engine: formats, context, memory, limits."""
    spec = CacheSpec.of(model.cfg, cache_dtypes(cfg, model.dtype), with_mtp=model.mtp is not None)
    device = _device(model)
    byte_budget, device_bytes, weight_bytes = cfg.cache_bytes, None, 0
    if byte_budget is None and device.type == "cuda":
        free, device_bytes = torch.cuda.mem_get_info(device)
        weight_bytes = device_bytes - free  # weights, CUDA context, anything already resident
    elif byte_budget is None:
        byte_budget = CPU_CACHE_BYTES
    return BudgetInputs(
        spec=spec, context_len=cfg.context_len or model.cfg.max_position_embeddings,
        page_size=cfg.page_size, byte_budget=byte_budget, device_bytes=device_bytes,
        mem_fraction=cfg.mem_fraction, weight_bytes=weight_bytes,
        max_running_requests=cfg.max_running_requests, state_slots=cfg.state_slots,
        extra_slots=cfg.extra_slots,
        slots_per_request=3 if cfg.radix is RadixMode.KV_AND_STATE else 1,
        max_pages=cfg.max_pages, label="engine")
