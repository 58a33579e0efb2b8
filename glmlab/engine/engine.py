"""Engine: continuous batching of GLM-5.3-Flash over a hybrid cache, one ``step()`` at a time.

    batch   = scheduler.schedule()          which requests, how many tokens each (no tensors)
    plan    = runner.plan(batch.entries)    per-step metadata, built once
    result  = runner.forward(plan)          the model over the flat batch
    sampled = runner.sample(reqs, logits)   one token per sampling entry (+ logprobs if asked)
    updates = scheduler.update(batch, ...)  tokens appended, finished requests released
    outputs                                 one ``RequestOutput`` per request: ids, text delta,
                                            logprobs, cached tokens, finish reason, matched stop

``Engine.from_pretrained(path_or_preset, EngineConfig)`` is the way in: the ``ModelRunner`` loads
the checkpoint as the config asks (dtype, FP8 weights kept or dequantised, backends), sizes and
allocates the pools, and runs every forward. With speculation on, ``SpecPhase`` executes the
batch through the same runner. Each request has one incremental ``Detokenizer`` here (its text
deltas, its stop strings). Requests are validated once, in ``add_request``: a bad one raises
``InvalidRequest`` naming the field, whoever the caller is (``LLM``, the HTTP service).

A prefill/decode instance uses the same loop with ``hold_after_prefill`` / ``imported``
requests and ``CacheTarget`` to find what to transfer. The engine knows nothing about HTTP or
transfers.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from glmlab.checkpoint.presets_dir import resolve_model
from glmlab.core import (
    Batch,
    CacheTarget,
    GrammarMatcher,
    InvalidRequest,
    Req,
    RequestOutput,
    Sampled,
    SamplingParams,
    Status,
    TokenLogprob,
    make_generator,
)
from glmlab.engine import parallel
from glmlab.engine.config import EngineConfig
from glmlab.engine.detokenizer import Decoder, Detokenizer
from glmlab.engine.model_runner import ModelRunner, load_model_for
from glmlab.engine.requests import check_request
from glmlab.engine.scheduler import Scheduler
from glmlab.engine.stats import EngineStats, TokenCounts
from glmlab.model.glm import GLM5Model
from glmlab.sampling import logprobs_of
from glmlab.speculative.engine_phase import SpecPhase
from glmlab.tokenizer import Tokenizer
from glmlab.trace.tracer import NULL_TRACER, Tracer

Prepare = Callable[[GLM5Model, EngineConfig], tuple[GLM5Model, EngineConfig]]


class Engine:
    def __init__(self, model: GLM5Model, cfg: EngineConfig | None = None,
                 tokenizer: Decoder | None = None, tracer: Tracer = NULL_TRACER,
                 eos_token_ids: Sequence[int] = ()):
        self.runner = ModelRunner(model, cfg)
        self.cfg, self.model, self.cache = self.runner.cfg, model, self.runner.cache
        self.budget = self.runner.budget
        self.context_len = self.budget.inputs.context_len
        spec = self.cfg.speculative
        self.spec = SpecPhase(self.runner, spec, self.budget.inputs.spec_slots, self.runner.draft,
                              self.cfg.seed, tracer) if spec else None
        self.scheduler = Scheduler(self.cfg, self.cache, self.budget.max_running_requests, tracer,
                                   verify_width=self._verify_width if self.spec else None,
                                   stop_string=self._stop_string)
        self.tokenizer, self.tracer = tokenizer, tracer
        self.eos_token_ids = tuple(eos_token_ids or getattr(tokenizer, "eos_token_ids", ())
                                   or model.cfg.eos_token_ids)
        self._ids = itertools.count()
        self.counts = TokenCounts()
        self._requests: dict[str, Req] = {}
        self._detok: dict[str, Detokenizer] = {}

    @classmethod
    def from_pretrained(cls, model: str | Path, cfg: EngineConfig | None = None,
                        tracer: Tracer = NULL_TRACER, prepare: Prepare | None = None,
                        **kwargs) -> Engine:
        """A checkpoint directory or preset (``tiny``, ``slice:N``) served as ``cfg`` says, with
        its tokenizer. ``prepare(model, cfg) -> (model, cfg)`` runs between loading and sizing
        the pools (a TP rank: its shard, and the budget its group agreed on)."""
        cfg = cfg or EngineConfig()
        path = resolve_model(str(model))
        loaded = load_model_for(path, cfg)
        if prepare is not None:
            loaded, cfg = prepare(loaded, cfg)
        tokenizer = (Tokenizer.from_dir(path, loaded.cfg.eos_token_ids)
                     if (path / "tokenizer.json").is_file() else None)
        return cls(loaded, cfg, tokenizer, tracer, **kwargs)

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        start = time.perf_counter_ns()
        reqs = [e.req for e in batch.entries if e.samples]
        sampled, children = self._execute(batch, reqs)
        logprobs = {r.rid: s.logprobs for r, s in zip(reqs, sampled, strict=True)}
        updates = self.scheduler.update(batch, [s.tokens for s in sampled])
        for c, s in children:  # siblings of a parallel-sampled prompt, forked this step
            logprobs[c.rid] = s.logprobs
            updates.append((c, self.scheduler.start(c, s.tokens[0])))
        self.counts.add(batch, sampled)
        outputs = [self._output(req, new, logprobs.get(req.rid)) for req, new in updates]
        self.tracer.on_step(batch, self.cache.usage, start, time.perf_counter_ns())
        return outputs

    def execute(self, batch: Batch) -> list[Sampled]:
        """The batch's forward and sampling: per sampling entry its token, or with speculation
        a VERIFY entry's emitted tokens (``glmlab.speculative.engine_phase``)."""
        return self._execute(batch, [e.req for e in batch.entries if e.samples])[0]

    def _execute(self, batch: Batch, reqs: list[Req]
                 ) -> tuple[list[Sampled], list[tuple[Req, Sampled]]]:
        if self.spec is not None:
            return self.spec.execute(batch, self.scheduler.running), []
        plan = self.runner.plan(batch.entries)
        rows, sample_at = parallel.logit_rows(batch.entries)
        if len(rows) != len(sample_at):  # prompt logprobs: every row of those chunks
            rows_t = torch.tensor(rows, dtype=torch.long, device=plan.input_ids.device)
            plan = dataclasses.replace(plan, logit_rows=rows_t)
        logits = self.runner.forward(plan).logits
        if len(rows) != len(sample_at):
            parallel.score_prompts(batch.entries, logits, logprobs_of)
            logits = logits[torch.tensor(sample_at, dtype=torch.long, device=logits.device)]
        children = self._fork(reqs)
        if not children:
            return self.sample(reqs, logits), []
        at = {r.rid: i for i, r in enumerate(reqs)}
        rows_of = [at[parent.rid] for parent, _ in children]
        both = self.sample(reqs + [c for _, c in children],
                           torch.cat([logits, logits[torch.tensor(rows_of, device=logits.device)]]))
        return both[:len(reqs)], [(c, s) for (_, c), s in zip(children, both[len(reqs):],
                                                              strict=True)]

    def _fork(self, reqs: list[Req]) -> list[tuple[Req, Req]]:
        """(parent, sibling) for the prompts with ``n > 1`` done prefilling now; siblings the
        pools cannot hold are queued instead (``parallel.fork_siblings``)."""
        forked, queued = parallel.fork_siblings(self.cache, reqs)
        for c in [c for _, c in forked] + queued:
            self._adopt_record(c)
        for c in queued:
            self.scheduler.add(c)
        return forked

    def _adopt_record(self, req: Req) -> None:
        self._requests[req.rid] = req
        if self.tokenizer is not None:
            self._detok[req.rid] = Detokenizer(self.tokenizer, req.params)

    def sample(self, reqs: list[Req], logits: torch.Tensor) -> list[Sampled]:
        return self.runner.sample(reqs, logits)

    def _output(self, req: Req, new: tuple[int, ...],
                logprobs: tuple[TokenLogprob, ...] | None) -> RequestOutput:
        final = req.finish_reason is not None
        detok = self._detok.pop(req.rid, None) if final else self._detok.get(req.rid)
        text = detok.take(final) if detok is not None else ""
        if req.params.logprobs is None:
            logprobs = None
        elif logprobs is not None:
            logprobs = logprobs[:len(new)]  # tokens after a finish were cut
        done = len(req.token_ids) - req.num_prompt
        prompt_lps = None
        if req.params.prompt_logprobs_from is not None and new and done == len(new):
            prompt_lps = tuple(req.prompt_logprobs)  # on the first record
        if final:
            self.runner.sampler.release(req.rid)
        return RequestOutput(req.rid, new, text, logprobs, req.cached_tokens, req.finish_reason,
                             req.matched_stop, req.num_prompt, done, prompt_lps)

    def _verify_width(self, req: Req) -> int:
        """Requests whose logits the sampler adjusts or masks decode without speculation (the
        drafts were proposed from unadjusted distributions)."""
        if req.params.adjusts_logits or req.grammar is not None:
            return 0
        return self.spec.verify_width(req)

    def _stop_string(self, req: Req, token: int) -> str | None:
        detok = self._detok.get(req.rid)
        can_stop = len(req.token_ids) - req.num_prompt > req.params.min_new_tokens
        return detok.add(token, can_stop) if detok is not None else None

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                    rid: str | None = None, imported: bool = False,
                    hold_after_prefill: bool = False,
                    grammar: GrammarMatcher | None = None) -> str:
        """Queue a request; returns its id, or raises ``InvalidRequest`` (a ``ValueError``).
        ``imported``: its prompt's cache content will be written from outside (see
        ``import_targets``); ``hold_after_prefill``: keep its cache after the first token for
        export (``export_target``, then ``release_held``). ``params.n > 1``: the samples are
        requests ``sample_rid(rid, i)`` (sample 0 is ``rid``); ``grammar``: the tokens allowed
        next (``glmlab.grammar``), masked in the sampler."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequest("params", f"expected SamplingParams, got {type(params).__name__}")
        try:
            ids = [operator.index(t) for t in prompt_ids]
        except TypeError:
            raise InvalidRequest("prompt", "token ids must be integers") from None
        req = self._new_request(ids, params, rid)
        req.imported, req.hold_after_prefill, req.grammar = imported, hold_after_prefill, grammar
        if grammar is not None and params.n > 1:
            raise InvalidRequest("n", "a grammar-constrained request has one sample (n = 1): "
                                 "give each sample its own matcher")
        # speculation keeps per-request drafter state that a fork cannot copy: then n requests
        # from the start (the radix tree may share). Otherwise one prefill, or one import
        siblings = parallel.siblings(req) if params.n > 1 and self.spec else []
        for c in siblings:
            if c.rid in self._requests and self._requests[c.rid].status is not Status.FINISHED:
                raise InvalidRequest("rid", f"request id {c.rid!r} is already in use")
        for r in (req, *siblings):
            self._adopt_record(r)
            self.scheduler.add(r)
        return req.rid

    def _new_request(self, ids: list[int], params: SamplingParams, rid: str | None) -> Req:
        n = next(self._ids)
        rid = rid if rid is not None else f"r{n}"
        if rid in self._requests and self._requests[rid].status is not Status.FINISHED:
            raise InvalidRequest("rid", f"request id {rid!r} is already in use")
        max_len = check_request(self, ids, params)
        stop = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop |= set(self.eos_token_ids)
        gen = make_generator(params, self.runner.device)
        seed = params.seed if params.seed is not None else self.cfg.seed * 1_000_003 + n
        if gen is not None and params.seed is None:  # reproducible: derive from the engine seed
            gen.manual_seed(seed)
        return Req(rid, ids, len(ids), params, max_len, frozenset(stop), gen,
                   seed=seed & ((1 << 63) - 1))

    def abort(self, rid: str) -> RequestOutput | None:
        """End ``rid`` wherever it is (queued, running, awaiting import, held); frees all it holds.
        None if no such request is unfinished here."""
        req = self.scheduler.abort(rid)
        if self.spec is not None:
            self.spec.release(rid)
        return None if req is None else self._output(req, (), ())

    def request(self, rid: str) -> Req:
        return self._requests[rid]

    def forget(self, rid: str) -> None:
        """Drop a finished request's record (long-running servers)."""
        if self._requests[rid].status is Status.FINISHED:
            del self._requests[rid]

    # ------------------------------------------------------------------ inspection
    def stats(self) -> EngineStats:
        s, u, c = self.scheduler, self.cache.usage(), self.cache.stats
        return EngineStats(
            running=len(s.running), waiting=len(s.waiting), parked=len(s.parked),
            pages_used=u.pages_total - u.pages_free, pages_total=u.pages_total,
            pages_tree=u.pages_tree, pages_evictable=u.pages_evictable,
            state_slots_used=u.slots_total - u.slots_free, state_slots_total=u.slots_total,
            state_checkpoints=u.checkpoints, prompt_tokens=c.prompt_tokens,
            cached_tokens=c.cached_tokens, hit_rate=c.hit_rate,
            prefill_compute_tokens=self.counts.prefill_compute, decode_tokens=self.counts.decode,
            pages_allocated=self.cache.pages.num_allocated)

    def describe(self) -> dict:
        """The config as served: every knob, the model dtype, the bound backends, the pools."""
        b = self.budget
        return {**self.cfg.describe(), "model_dtype": str(self.model.dtype).removeprefix("torch."),
                "backends": self.model.backends.describe(), "context_len": self.context_len,
                "max_running_requests": b.max_running_requests, "num_pages": b.num_pages,
                "num_state_slots": b.num_state_slots}

    @property
    def is_idle(self) -> bool:
        """No request queued, running, awaiting an import or held."""
        s = self.scheduler
        return not (s.waiting or s.running or s.parked)

    def flush_cache(self) -> bool:
        """Empty the radix tree (pages and state checkpoints); False, doing nothing, unless idle."""
        if not self.is_idle:
            return False
        self.cache.flush()
        return True

    def leaks(self) -> list[str]:
        """What an idle engine still holds that no request owns (empty: nothing). Pages and state
        slots must be free or cached in the tree, speculative rows and detokenisers returned."""
        s = self.scheduler
        if not self.is_idle:
            return [f"not idle: {len(s.running)} running, {len(s.waiting)} waiting, "
                    f"{len(s.parked)} parked"]
        out = []
        try:
            self.cache.check_idle()
        except AssertionError as e:
            out.append(str(e))
        if self.spec is not None and any(self.spec.held([]).values()):
            out.append(f"speculative state held: {self.spec.held([])}")
        if self._detok:
            out.append(f"detokenizers of ended requests: {sorted(self._detok)[:5]}")
        return out

    def assert_idle(self) -> None:
        problems = self.leaks()
        if problems:
            raise AssertionError("; ".join(problems))

    # ------------------------------------------------------------------ PD seams
    def import_targets(self) -> list[CacheTarget]:
        """Admitted imported requests whose cache content is still to be written."""
        return [self._target(r) for r in self.scheduler.parked.values()
                if r.status is Status.AWAITING_IMPORT]

    def complete_import(self, rid: str, first_token: int,
                        logprob: TokenLogprob | float | None = None,
                        draft_state: bool = False,
                        samples: Sequence[tuple[int, TokenLogprob | float | None]] = (),
                        ) -> list[RequestOutput]:
        """The imported content of ``rid`` is in the cache; it decodes from ``first_token``
        (sampled by the prefill instance, with its ``logprob`` and alternatives if the request
        asked). ``samples``: an import of ``n`` samples (one prompt, one transfer) gives the
        first tokens of samples 1..n-1; they fork from its lease here. ``draft_state``: the
        drafter's rows for the prompt were imported too (``spec.handoff.regions()``), so it
        speculates from its first decode step. One output per sample."""
        req = self.scheduler.parked.get(rid)
        want = len(req.cache.sample_slots) if req is not None and req.cache else 0
        if req is not None and len(samples) != want:
            raise ValueError(f"request {rid!r} lands {want + 1} samples, given "
                             f"{len(samples) + 1} first tokens")
        req = self.scheduler.land_import(rid)
        forks = parallel.fork_imported(self.cache, req) if samples else []
        outs = []
        for r, (token, lp) in zip([req, *forks], [(first_token, logprob), *samples],
                                  strict=True):
            if r is not req:
                self._adopt_record(r)
            new = self.scheduler.start(r, token)
            if draft_state and self.spec is not None and r.status is Status.RUNNING:
                self.spec.adopt(r)
            if lp is not None and not isinstance(lp, TokenLogprob):
                lp = TokenLogprob(token, float(lp))
            outs.append(self._output(r, new, None if lp is None else (lp,)))
        return outs

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
                           tuple(req.cache.pages[:pages]), req.cache.slot, self.cfg.page_size,
                           tuple(req.cache.sample_slots))
