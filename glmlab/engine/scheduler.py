"""Scheduler: which requests run this step and how many tokens each; what their results mean.

``schedule()`` builds a ``Batch`` (no tensors) under two per-step budgets,
``max_num_batched_tokens`` (everything) and ``max_prefill_tokens`` (prefill only):
1. decode: every running request with one token to go, growing its pages as it crosses a page
   boundary; when no page can be found, the newest running request is preempted (its lease is
   released and it is recomputed later from its tokens: prompt plus what it already produced);
2. prefill, oldest first: running requests in the middle of a prompt, then admissions from the
   queue (first come, first served, while a state slot and pages for the request's known tokens
   can be had and fewer than ``max_running`` run). Chunks are at most ``chunk_size`` tokens and
   end on page boundaries (so the radix tree can take them), and in ``kv_and_state`` mode at the
   positions where a state checkpoint is wanted. Without chunking, the first prompt of a step runs
   whole whatever its length; later ones wait for a step with room.

``update()`` advances every request by its entry, appends sampled tokens, finishes requests (stop
token, EOS, max_new_tokens, context length, or a stop string: ``stop_string(req, token)`` asks
the engine's detokeniser about each new token) and hands their cache back. It returns each
request that produced tokens with those tokens; the request carries its finish reason.

With speculative decoding (``verify_width``), a decoding request the drafter is ready for becomes a
``VERIFY`` entry of that many tokens (pages grown to hold the whole window); its result is the list
of emitted tokens, of which the scheduler keeps those up to a finish.

Requests that bring their own cache content (``imported``: a PD decode instance) are admitted into
``AWAITING_IMPORT`` and join the running set when the content is there (``land_import``, then
``start`` with the first token; an import of n samples reserves a state slot per sample);
``hold_after_prefill`` requests (a PD prefill instance) park in ``HELD`` after their first token
until ``release_held``. The scheduler knows nothing about tensors or the model.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from glmlab.cache.hybrid import HybridCache
from glmlab.core import Batch, Entry, FinishReason, Phase, RadixMode, Req, Status
from glmlab.engine.config import EngineConfig
from glmlab.trace.events import RequestEvent
from glmlab.trace.tracer import NULL_TRACER, Tracer


@dataclass
class _StepBudget:
    tokens: int
    prefill: int

    def take(self, n: int) -> None:
        self.tokens -= n
        self.prefill -= n

    @property
    def room(self) -> int:
        return max(0, min(self.tokens, self.prefill))


class Scheduler:
    def __init__(self, cfg: EngineConfig, cache: HybridCache, max_running: int,
                 tracer: Tracer = NULL_TRACER,
                 verify_width: Callable[[Req], int] | None = None,
                 stop_string: Callable[[Req, int], str | None] | None = None):
        self.cfg, self.cache, self.max_running = cfg, cache, max_running
        self.tracer, self.stop_string = tracer, stop_string
        # speculative decoding: tokens a decoding request verifies this step (0 = plain decode)
        self.verify_width = verify_width
        self.page_size = cache.page_size
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []  # admission order
        self.parked: dict[str, Req] = {}  # AWAITING_IMPORT and HELD
        self.num_steps = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, req: Req) -> None:
        self.waiting.append(req)
        self.tracer.emit(RequestEvent.now("add", req.rid, self.num_steps))

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> Batch | None:
        self.num_steps += 1
        budget = _StepBudget(self.cfg.max_num_batched_tokens, self.cfg.max_prefill_tokens)
        entries = self._decode_entries(budget)
        entries += self._prefill_entries(budget)
        return Batch(tuple(entries), self.num_steps) if entries else None

    def _decode_entries(self, budget: _StepBudget) -> list[Entry]:
        out = []
        for req in list(self.running):
            if req.status is not Status.RUNNING or req.extend_len != 1 or not req.output_ids:
                continue
            width = self.verify_width(req) if self.verify_width else 0
            n = max(1, width)  # a verify window's KV is written before it is accepted
            if budget.tokens < n:
                break
            if self._grow(req, req.computed_len + n):
                phase = Phase.VERIFY if width else Phase.DECODE
                out.append(Entry(req, req.computed_len, n, phase, samples=True))
                budget.tokens -= n
        return out

    def _prefill_entries(self, budget: _StepBudget) -> list[Entry]:
        out: list[Entry] = []
        for req in self.running:
            if req.extend_len > 1 or not req.output_ids:
                self._add_chunk(req, budget, out)
        while self.waiting and budget.room > 0:
            req = self.waiting[0]
            if not self._admit(req):
                break
            self.waiting.popleft()
            if req.status is Status.RUNNING and not self._add_chunk(req, budget, out):
                break  # admitted but no room left this step: stop holding more pages idle
        return out

    def _add_chunk(self, req: Req, budget: _StepBudget, out: list[Entry]) -> bool:
        start, todo = req.computed_len, req.extend_len
        if not self.cfg.chunked_prefill:
            n = todo if (todo <= budget.room or not out) else 0
        else:
            n = min(todo, budget.room, self.cfg.chunk_size)
            end = (start + n) // self.page_size * self.page_size
            if n < todo and end > start:
                n = end - start
        n = next((p - start for p in req.checkpoints if start < p < start + n), n)
        if n <= 0:
            return False
        budget.take(n)
        phase = Phase.DECODE if n == 1 and todo == 1 and req.output_ids else Phase.PREFILL
        out.append(Entry(req, start, n, phase, samples=n == todo))
        return True

    # ------------------------------------------------------------------ admission
    def _admit(self, req: Req) -> bool:
        in_flight = sum(r.status is Status.AWAITING_IMPORT for r in self.parked.values())
        if req.imported:
            if len(self.running) + in_flight >= self.max_running + self.cfg.extra_slots:
                return False
        elif len(self.running) >= self.max_running:
            return False
        reserve = req.num_prompt if req.imported else len(req.token_ids)
        tokens = req.token_ids
        if req.params.prompt_logprobs_from is not None and not req.output_ids:
            tokens = tokens[:max(1, req.params.prompt_logprobs_from)]  # computed from there
        # an imported prompt with n samples (not split into n imports) lands once for all of
        # them: a state slot each now; like a mixed engine's fork, the samples then run beyond
        # max_running (the pools, not the count, bound them)
        samples = req.params.n if req.imported and not req.forked else 1
        seq = self.cache.acquire(tokens, reserve, brings_state=req.imported, samples=samples)
        if seq is None:
            return False
        req.cache, req.computed_len = seq, seq.prefix_len
        if req.num_preemptions == 0:
            req.cached_tokens = seq.prefix_len
        if self.cfg.radix is RadixMode.KV_AND_STATE and not req.imported:
            req.checkpoints = self._checkpoint_positions(req)
        if req.imported:
            req.status = Status.AWAITING_IMPORT
            self.parked[req.rid] = req
        else:
            req.status = Status.RUNNING
            self.running.append(req)
        self.tracer.emit(RequestEvent.now("admit", req.rid, self.num_steps, seq.prefix_len))
        return True

    def _checkpoint_positions(self, req: Req) -> tuple[int, ...]:
        """Where this prompt leaves the cached KV (so its siblings can reuse the state there), and
        its last page boundary (so a longer follow-up prompt can)."""
        s, last = self.page_size, len(req.token_ids) - 1
        branch = self.cache.kv_prefix_len(req.token_ids[:last])
        wanted = {branch, last // s * s}
        return tuple(sorted(p for p in wanted if p > req.computed_len))

    # ------------------------------------------------------------------ memory pressure
    def _grow(self, req: Req, num_tokens: int) -> bool:
        while not self.cache.grow(req.cache, num_tokens):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Req) -> None:
        self.cache.release(req.cache, req.token_ids, req.computed_len)
        self.running.remove(req)
        req.cache, req.computed_len, req.checkpoints = None, 0, ()
        req.status, req.imported = Status.WAITING, False  # recomputed here from its tokens
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        self.tracer.emit(RequestEvent.now("preempt", req.rid, self.num_steps))

    # ------------------------------------------------------------------ update
    def update(self, batch: Batch, tokens: Sequence[Sequence[int]]
               ) -> list[tuple[Req, tuple[int, ...]]]:
        """``tokens``: per sampling entry its token, or for a VERIFY entry the tokens it emitted
        (accepted drafts, then the bonus token). Returns (request, its new tokens) for each."""
        outs, sampled = [], iter(tokens)
        for e in batch.entries:
            req = e.req
            emitted = next(sampled) if e.samples else None
            if e.phase is Phase.VERIFY:
                outs.append(self._update_verify(req, emitted))
                continue
            req.computed_len += e.num_tokens
            if e.phase is Phase.PREFILL and req.computed_len % self.page_size == 0:
                self.cache.commit(req.cache, req.token_ids, req.computed_len, checkpoint=True)
            if emitted is None:
                continue
            (token,) = emitted
            if req.grammar_refused is not None:  # told late, refused: ends before this token
                req.matched_stop = req.grammar_refused
                self._finish(req, FinishReason.STOP)
                outs.append((req, ()))
                continue
            req.token_ids.append(token)
            # a prefill-role request is held whatever its first token: the decode instance
            # applies the finish rules to it (``start``)
            reason = (FinishReason.PREFILLED if req.hold_after_prefill
                      else self._finish_reason(req))
            outs.append((req, (token,)))
            if reason is FinishReason.PREFILLED:
                self._park_held(req)
            elif reason is not None:
                self._finish(req, reason)
        return outs

    def _update_verify(self, req: Req, emitted: Sequence[int]) -> tuple[Req, tuple[int, ...]]:
        """The window's anchor and accepted drafts are now computed; a stop token or the length
        limit among the emitted tokens cuts the rest off."""
        new, reason = [], None
        for token in emitted:
            req.token_ids.append(token)
            req.computed_len += 1  # the position before ``token`` (anchor, then accepted drafts)
            new.append(token)
            reason = self._finish_reason(req)
            if reason is not None:
                break
        if reason is not None:
            self._finish(req, reason)
        return req, tuple(new)

    def _finish_reason(self, req: Req) -> FinishReason | None:
        token = req.token_ids[-1]
        text_stop = self.stop_string(req, token) if self.stop_string is not None else None
        # before min_new_tokens nothing stops it (the sampler masks the stop tokens too)
        early = len(req.token_ids) - req.num_prompt <= req.params.min_new_tokens
        if not early and (token in req.stop_ids or text_stop is not None):
            req.matched_stop = token if token in req.stop_ids else text_stop
            return FinishReason.STOP
        if req.grammar is not None:
            if token not in req.grammar.stop_token_ids:
                # it cannot end the grammar: the sampler tells the matcher at the next mask
                # fill, while that step's forward runs (xgrammar's accept is ~30 us of GIL-held
                # host work per request, which here would leave the GPU idle)
                req.grammar_pending = token
            elif not req.grammar.accept(token) or req.grammar.is_terminated():
                req.matched_stop = token  # the grammar is complete (or refused: never expected)
                return FinishReason.STOP
        if len(req.token_ids) >= req.max_len:
            return FinishReason.LENGTH
        return None

    def _finish(self, req: Req, reason: FinishReason) -> None:
        if req.cache is not None:
            self.cache.release(req.cache, req.token_ids, req.computed_len)
            req.cache = None
        if req in self.running:
            self.running.remove(req)
        self.parked.pop(req.rid, None)
        req.status, req.finish_reason = Status.FINISHED, reason
        self.tracer.emit(RequestEvent.now(reason.value, req.rid, self.num_steps))

    def _park_held(self, req: Req) -> None:
        self.running.remove(req)
        req.status, req.finish_reason = Status.HELD, FinishReason.PREFILLED
        self.parked[req.rid] = req

    # ------------------------------------------------------------------ outside events
    def abort(self, rid: str) -> Req | None:
        req = self.parked.get(rid) or next((r for r in (*self.running, *self.waiting)
                                            if r.rid == rid), None)
        if req is None:
            return None
        if req in self.waiting:
            self.waiting.remove(req)
        self._finish(req, FinishReason.ABORT)
        return req

    def land_import(self, rid: str) -> Req:
        """The imported content of ``rid`` is in the cache: its prompt counts as computed and its
        whole pages join the tree. ``start`` it next (after forking its samples, if any)."""
        req = self.parked.get(rid)
        if req is None or req.status is not Status.AWAITING_IMPORT:
            raise ValueError(f"no request {rid!r} is waiting for an import")
        del self.parked[rid]
        req.computed_len = req.num_prompt
        s = self.page_size
        self.cache.commit(req.cache, req.token_ids, req.num_prompt // s * s, checkpoint=False)
        return req

    def start(self, req: Req, first_token: int) -> tuple[int, ...]:
        """``req`` has its prompt computed (imported, or forked from a sibling's lease:
        ``glmlab.engine.parallel``) and continues from ``first_token``. One without a lease
        queues to recompute prompt and first token, or, a prefill-role sample, ends at once."""
        req.token_ids.append(first_token)
        reason = FinishReason.PREFILLED if req.hold_after_prefill else self._finish_reason(req)
        if req.cache is None:
            if reason is None:
                req.status = Status.WAITING
                self.add(req)
            else:  # a prefill-role sample holds nothing to export
                self._finish(req, reason)
            return (first_token,)
        self.running.append(req)
        req.status = Status.RUNNING
        if req.sample_index:  # a forked sample is admitted now (its parent was earlier)
            self.tracer.emit(RequestEvent.now("admit", req.rid, self.num_steps,
                                              req.cached_tokens))
        if reason is FinishReason.PREFILLED:
            self._park_held(req)
        elif reason is not None:
            self._finish(req, reason)
        return (first_token,)

    def release_held(self, rid: str) -> None:
        req = self.parked.get(rid)
        if req is None or req.status is not Status.HELD:
            raise ValueError(f"no request {rid!r} is held after prefill")
        self._finish(req, FinishReason.PREFILLED)
