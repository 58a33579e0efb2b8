"""The narrow contract between the workers and ``glmlab.engine.Engine``, and the one addition.

The workers need: queue a request (whole, prefill-and-hold, or imported), step, abort, the cache
target of a held or an imported request, complete an import, pool statistics, and a cache flush.
All of that is the Engine's public API. The one thing it lacks is the sampled tokens' logprobs
(``return_logprob``): ``LogprobEngine`` adds them by overriding ``Engine.sample``, reading the
same logits the sampler used; requests that do not ask pay nothing.

Everything here runs on the worker's engine thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from glmlab.checkpoint.loader import load_model
from glmlab.engine.config import ComputeDtype
from glmlab.engine.engine import Engine
from glmlab.engine.sampler import SamplingParams
from glmlab.engine.types import CacheTarget, FinishReason, StepOutput
from glmlab.serve.backend import Finish
from glmlab.serve.config import WorkerConfig, engine_config
from glmlab.tokenizer import Tokenizer

Lease = CacheTarget  # where a request's cache content lives: pages, prefix_len, state_slot


@dataclass(frozen=True)
class StepEvent:
    rid: str
    new_ids: tuple[int, ...]
    new_logprobs: tuple[float, ...] | None
    cached_tokens: int
    finish: Finish | None


class LogprobEngine(Engine):
    """An Engine that also reports log-softmax of the raw logits at each sampled token."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.want_logprobs: set[str] = set()
        self.logprobs: dict[str, list[float]] = {}

    def sample(self, batch, logits: torch.Tensor) -> list[int]:
        tokens = super().sample(batch, logits)
        if self.want_logprobs:
            reqs = [e.req for e in batch.entries if e.samples]
            for i, (req, tok) in enumerate(zip(reqs, tokens, strict=True)):
                if req.rid in self.want_logprobs:
                    lp = torch.log_softmax(logits[i].float(), -1)[tok]
                    self.logprobs.setdefault(req.rid, []).append(float(lp))
        return tokens


class EngineAdapter:
    def __init__(self, engine: LogprobEngine):
        self.engine = engine
        storage = engine.cache.storage
        self.storage, self.page_size = storage, storage.page_size
        self.kpool = engine.model.cfg.dsa.index_kpool
        self.context_len, self.vocab_size = engine.context_len, engine.model.cfg.vocab_size
        self.eos_token_ids = engine.eos_token_ids
        self._reported_imports: set[str] = set()

    @classmethod
    def load(cls, wc: WorkerConfig) -> EngineAdapter:
        cfg = engine_config(wc.spec.role, wc.engine, wc.spec.device)
        tok = Tokenizer.from_dir(wc.model_dir)
        dtype = {ComputeDtype.BF16: torch.bfloat16, ComputeDtype.FP32: torch.float32}.get(
            cfg.dtype, torch.float32 if wc.spec.device == "cpu" else torch.bfloat16)
        model = load_model(Path(wc.model_dir), dtype=dtype, device=wc.spec.device)
        model.use_backends(cfg.backends)
        return cls(LogprobEngine(model, cfg, detokenize=tok.decode,
                                 eos_token_ids=tok.eos_token_ids or model.cfg.eos_token_ids))

    def pages_for(self, n: int) -> int:
        return -(-n // self.page_size)

    # the loop --------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.engine.has_work

    def step(self) -> list[StepEvent]:
        return [self._event(o) for o in self.engine.step()]

    def _event(self, out: StepOutput) -> StepEvent:
        rid = out.rid
        lps = self.engine.logprobs.pop(rid, None)
        finish = None
        if out.finished:
            finish = _finish(out, self.engine.request(rid).token_ids[-1] if out.new_token_ids
                             else None)
        cached = self.engine.request(rid).cached_tokens
        if out.finished and out.finish_reason is not FinishReason.PREFILLED:
            self._forget(rid)
        return StepEvent(rid, tuple(out.new_token_ids), None if lps is None else tuple(lps),
                         cached, finish)

    def _forget(self, rid: str) -> None:
        self.engine.want_logprobs.discard(rid)
        self.engine.logprobs.pop(rid, None)
        self._reported_imports.discard(rid)
        self.engine.forget(rid)

    # requests --------------------------------------------------------------------------------
    def _add(self, rid: str, ids: Sequence[int], params: SamplingParams, logprobs: bool,
             **kind) -> None:
        self.engine.add_request(ids, params, rid=rid, **kind)
        if logprobs:
            self.engine.want_logprobs.add(rid)

    def submit(self, rid, ids, params, logprobs: bool) -> None:
        self._add(rid, ids, params, logprobs)

    def submit_prefill(self, rid, ids, params, logprobs: bool) -> None:
        self._add(rid, ids, params, logprobs, hold_after_prefill=True)

    def submit_import(self, rid, ids, params, logprobs: bool) -> None:
        self._add(rid, ids, params, logprobs, imported=True)

    def abort(self, rid: str) -> None:
        """Frees whatever ``rid`` holds (queued, running, awaiting import or held)."""
        self.engine.abort(rid)
        try:
            self.engine.request(rid)
        except KeyError:
            return  # never queued here, or already forgotten
        self._forget(rid)

    # PD seams ----------------------------------------------------------------------------------
    def held_lease(self, rid: str) -> Lease:
        return self.engine.export_target(rid)

    def release_held(self, rid: str) -> None:
        self.engine.release_held(rid)
        self._forget(rid)

    def take_import_leases(self) -> list[tuple[str, Lease]]:
        """Imported requests admitted since the last call, with where their content goes."""
        out = []
        for t in self.engine.import_targets():
            if t.rid not in self._reported_imports:
                self._reported_imports.add(t.rid)
                out.append((t.rid, t))
        return out

    def complete_import(self, rid: str, first_token: int, logprob: float | None) -> StepEvent:
        out = self.engine.complete_import(rid, first_token)
        if logprob is not None and rid in self.engine.want_logprobs:
            self.engine.logprobs[rid] = [logprob]
        return self._event(out)

    # inspection --------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        s, u = self.engine.scheduler, self.engine.cache.usage()
        used = u.pages_total - u.pages_free
        return {"num_running_reqs": len(s.running), "num_queue_reqs": len(s.waiting),
                "num_parked_reqs": len(s.parked),
                "token_usage": used / max(1, u.pages_total),
                "pages_used": used, "pages_total": u.pages_total,
                "pages_tree": u.pages_tree, "pages_evictable": u.pages_evictable,
                "state_slots_used": u.slots_total - u.slots_free,
                "state_slots_total": u.slots_total, "state_checkpoints": u.checkpoints,
                "cache_hit_rate": self.engine.cache.stats.hit_rate,
                "cached_tokens_total": self.engine.cache.stats.cached_tokens}

    def leak_check(self) -> str:
        """"ok" when nothing holds a lease and every pool is free or evictable cache."""
        s = self.engine.scheduler
        if s.running or s.waiting or s.parked:
            return "busy"
        try:
            self.engine.cache.check_idle()
        except AssertionError as e:
            return f"leak: {e}"
        return "ok"

    def flush_cache(self) -> bool:
        s, tree = self.engine.scheduler, self.engine.cache.tree
        if s.running or s.waiting or s.parked:
            return False
        if tree is not None:
            tree.evict(self.engine.cache.pages.capacity)
            tree.evict_checkpoints(self.engine.cache.slots.capacity)
        return True

    def describe(self) -> dict:
        b = self.engine.budget
        return {**self.engine.cfg.describe(), "max_running_requests": b.max_running_requests,
                "num_pages": b.num_pages, "num_state_slots": b.num_state_slots,
                "context_len": self.context_len}


def _finish(out: StepOutput, last_token: int | None) -> Finish:
    reason = out.finish_reason
    if reason is FinishReason.STOP:
        return Finish("stop", out.stop_str if out.stop_str is not None else last_token)
    if reason is FinishReason.PREFILLED:
        return Finish("prefilled")
    if reason is FinishReason.ABORT:
        return Finish("abort", message="aborted")
    return Finish("length")
