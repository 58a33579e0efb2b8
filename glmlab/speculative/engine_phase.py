"""The VERIFY phase of ``Engine.step``: speculative cycles inside continuous batching.

With speculation on, the scheduler turns a decoding request into a ``Phase.VERIFY`` entry of
``width`` tokens (its pages grown to cover the window) whenever ``verify_width(req)`` says the
drafter knows every computed position of it; other entries (prefill chunks, plain decodes) run as
before. ``SpecPhase.execute(batch)`` returns what the scheduler's ``update`` consumes, one item per
sampling entry: a token for plain entries, the emitted tokens (accepted drafts + bonus) for
verify entries, so requests with different accept lengths advance in one batch.

- Plain entries run one forward (capturing the drafter's target layers) and are sampled by the
  engine's ``ModelRunner`` (``plan``, ``forward``, ``sample``: the same calls as without
  speculation); the drafter then learns their positions (MTP draft-extend / DFlash2 draft-KV
  projection), so a prompt is drafter-ready when its prefill ends.
- Verify entries run ``SpecDecoder.cycle``: draft -> verify -> accept -> commit, its plans and its
  target forward through the same runner (``EngineLayout``). Logprobs of emitted tokens come
  from the verify logits (the target's distribution at each position).
- Each speculating request holds one row of the verify-state store (``SpecStateStore``), taken on
  its first cycle; rows, drafter state and "learned" marks of requests that are no longer running
  (finished, aborted, preempted) are returned at the next step (``sync``) or at once by ``release``.
- A PD decode instance imports requests whose prompt a prefill instance's drafter learned; the
  rows it received (``handoff``: MTP chain start, DFlash2 draft KV) are adopted with the request
  (``adopt``), so it verifies from its first decode step. A request whose prompt the drafter never
  saw (imported without them) decodes plainly.
- ``totals`` counts cycles, verified requests and committed tokens since start (what a server
  reports as its acceptance length); ``stats`` keeps each cycle for studies (``trim`` bounds it).

``spec_budget`` charges the budget for the rows (one per running request + 1) and the draft KV.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Protocol

import torch

from glmlab.cache.budget import BudgetInputs, plan_budget
from glmlab.cache.hybrid import HybridCache
from glmlab.core import Batch, Entry, Phase, Req, Sampled
from glmlab.model.glm import GLM5Model
from glmlab.model.plan import ForwardPlan, StepPlan, StepResult, VerifyRecorder
from glmlab.sampling import logprobs_of
from glmlab.speculative.commit import SpecStateStore
from glmlab.speculative.config import SpecConfig
from glmlab.speculative.cycle import PHASES, CycleStats
from glmlab.speculative.dflash import DFlashDraftModel
from glmlab.speculative.dflash_io import load_draft
from glmlab.speculative.draft_kv import DraftKVLayout
from glmlab.speculative.factory import make_decoder
from glmlab.speculative.handoff import DraftHandoff
from glmlab.speculative.replay import CommitMode
from glmlab.speculative.types import SpecRequest, TargetStates
from glmlab.trace.events import CycleEvent
from glmlab.trace.tracer import NULL_TRACER, Tracer


class StepRunner(Protocol):
    """What the phase needs of the engine's ``ModelRunner`` (the same plans, forward, sampler)."""

    model: GLM5Model
    cache: HybridCache
    device: torch.device

    def plan(self, entries: Sequence[Entry], capture_layers: tuple[int, ...] = ()
             ) -> StepPlan: ...

    def forward_plan(self, pages: Sequence[Sequence[int]], seq_lens: Sequence[int],
                     cache_lens: Sequence[int], slots: Sequence[int],
                     verify: VerifyRecorder | None = None) -> ForwardPlan: ...

    def forward(self, plan: StepPlan) -> StepResult: ...

    def sample(self, reqs: Sequence[Req], logits: torch.Tensor) -> list[Sampled]: ...


class EngineLayout:
    """``CacheLayout`` over the engine's pools: rows are state slots, pages come from leases;
    plans and forwards are the runner's."""

    def __init__(self, runner: StepRunner):
        self.runner, self.hybrid = runner, runner.cache
        self.cache, self.device = runner.cache.storage, runner.device
        self.page_size = self.hybrid.page_size
        self._pages: dict[int, list[int]] = {}  # state slot -> the lease's (live) page list

    def track(self, req: Req) -> None:
        self._pages[req.cache.slot] = req.cache.pages

    def plan(self, rows: list[int], seq_lens: list[int], cache_lens: list[int],
             verify: VerifyRecorder | None = None) -> ForwardPlan:
        return self.runner.forward_plan([self._pages[r] for r in rows], seq_lens, cache_lens,
                                        rows, verify)

    def forward(self, plan: StepPlan) -> StepResult:
        return self.runner.forward(plan)

    def token_slots(self, row: int, start: int, end: int) -> torch.Tensor:
        s = self.page_size
        pages = torch.tensor(self._pages[row], dtype=torch.long, device=self.device)
        pos = torch.arange(start, end, device=self.device)
        return pages[pos // s] * s + pos % s

    def capacity(self, row: int) -> int:
        return len(self._pages[row]) * self.page_size


def load_spec_draft(model: GLM5Model, spec: SpecConfig, tokenizer=None) -> DFlashDraftModel | None:
    if spec.algorithm != "dflash2":
        return None
    if spec.draft_path is None:
        raise ValueError("dflash2 needs a draft checkpoint (--speculative-draft-path)")
    return load_draft(spec.draft_path, model.cfg, dtype=model.dtype,
                      device=model.embed_tokens.weight.device, tokenizer=tokenizer)


def spec_budget(inputs: BudgetInputs, model: GLM5Model, spec: SpecConfig,
                draft: DFlashDraftModel | None, state_dtype: torch.dtype) -> BudgetInputs:
    """Charge draft KV per token slot and one verify-state row per running request (+1)."""
    footprint = inputs.footprint
    if draft is not None:
        c = draft.cfg
        layout = DraftKVLayout(c.num_layers, c.num_kv_heads, c.head_dim, spec.draft_kv_dtype)
        footprint = dataclasses.replace(footprint, draft_bytes_per_token=layout.bytes_per_token)
    per_row = SpecStateStore.bytes_per_slot(model.cfg, spec.width, CommitMode(spec.commit),
                                            model.dtype, state_dtype)["total"]
    first = plan_budget(dataclasses.replace(inputs, footprint=footprint))
    rows = first.max_running_requests + 1  # the second pass can only lower the request count
    return dataclasses.replace(inputs, footprint=footprint, spec_slots=rows,
                               spec_bytes_per_slot=per_row)


class SpecPhase:
    def __init__(self, runner: StepRunner, spec: SpecConfig, num_rows: int,
                 draft: DFlashDraftModel | None = None, seed: int = 0,
                 tracer: Tracer = NULL_TRACER):
        self.runner, self.model, self.spec, self.tracer = runner, runner.model, spec, tracer
        self.layout = EngineLayout(runner)
        self.decoder = make_decoder(self.model, self.layout, spec, draft=draft, seed=seed,
                                    store_rows=num_rows)
        self.store = self.decoder.store
        self.free_rows = list(range(num_rows))[::-1]
        self.row_of: dict[str, int] = {}  # rid -> store row
        self.owner: dict[int, str] = {}  # state slot -> the rid last seen in it
        self.learned: dict[str, int] = {}  # rid -> positions the drafter has learned
        self.stats: list[CycleStats] = []
        self.totals = {"cycles": 0, "verified": 0, "committed": 0}
        self._last_end: float | None = None
        storage = runner.cache.storage
        self.handoff = DraftHandoff(self.decoder.drafter, storage.num_state_slots,
                                    storage.device)

    @property
    def width(self) -> int:
        return self.decoder.width

    def verify_width(self, req: Req) -> int:
        """The scheduler's question: verify ``width`` tokens of ``req`` this step, or 0."""
        return self.width if self.learned.get(req.rid) == req.computed_len else 0

    # ------------------------------------------------------------------ the step
    @torch.inference_mode()
    def execute(self, batch: Batch, running: list[Req]) -> list[Sampled]:
        """One item per sampling entry of ``batch``: its token, or a verify entry's tokens."""
        self.sync(running)
        out: dict[int, Sampled] = {}
        plain = [e for e in batch.entries if e.phase is not Phase.VERIFY]
        verify = [e for e in batch.entries if e.phase is Phase.VERIFY]
        if plain:
            out.update(self._plain(plain))
        if verify:
            out.update(self._verify(verify, batch.step))
        return [out[id(e)] for e in batch.entries if e.samples]

    def _plain(self, entries: list[Entry]) -> dict[int, Sampled]:
        for e in entries:
            self._track(e.req)
            if e.phase is Phase.PREFILL and e.start != self.learned.get(e.req.rid):
                self.learned[e.req.rid] = e.start  # a new prompt, a recompute or a prefix hit
        plan = self.runner.plan(entries, capture_layers=self.decoder.drafter.capture_layers)
        result = self.runner.forward(plan)
        sampled = [e for e in entries if e.samples]
        picks = self.runner.sample([e.req for e in sampled], result.logits) if sampled else []
        by_entry = dict(zip((id(e) for e in sampled), picks, strict=True))
        self._learn(entries, result.hidden, result.features,
                    {k: s.tokens[0] for k, s in by_entry.items()})
        return by_entry

    def _learn(self, entries: list[Entry], hidden, feats, sampled: dict[int, int]) -> None:
        """Let the drafter learn the positions plain entries computed (when it knows the rest)."""
        keep, pos, hs, fs, toks, nxt = [], [], [], [], [], []
        offset = 0
        for e in entries:
            n, req = e.num_tokens, e.req
            rows = slice(offset, offset + n)
            offset += n
            if self.learned.get(req.rid) != e.start:
                continue  # the drafter missed earlier positions (e.g. imported): decode plainly
            ids = req.token_ids[e.start:e.start + n]
            after = sampled[id(e)] if e.samples else req.token_ids[e.start + n]
            keep.append(SpecRequest(row=req.cache.slot, params=req.params, committed=e.start))
            pos.append(e.start)
            hs.append(hidden[rows])
            fs.append(feats[rows])
            toks.append(ids)
            nxt.append(ids[1:] + [after])
            self.learned[req.rid] = e.start + n
        if keep:
            self.decoder.drafter.extend(keep, TargetStates(pos, hs, fs, toks, nxt))
        for e in entries:  # a PD prefill: the prompt is learned, stage what decode needs
            done = self.learned.get(e.req.rid) == e.start + e.num_tokens
            if e.samples and e.req.hold_after_prefill and done:
                self.handoff.stage(e.req.cache.slot)

    def _verify(self, entries: list[Entry], step: int) -> dict[int, Sampled]:
        start, start_ns = time.perf_counter(), time.perf_counter_ns()
        reqs = []
        for e in entries:
            self._track(e.req)
            self._bind(e.req)
            reqs.append(SpecRequest(row=e.req.cache.slot, params=e.req.params, committed=e.start,
                                    anchor=e.req.token_ids[-1], generator=e.req.generator))
        result = self.decoder.cycle(reqs)
        for e, toks in zip(entries, result.emitted, strict=True):
            self.learned[e.req.rid] = e.start + len(toks)
        gap = 0.0 if self._last_end is None else max(0.0, start - self._last_end)
        phases = dict(result.stats.phase_s, rest=gap)  # scheduling, other entries, stage gaps
        self.stats.append(dataclasses.replace(result.stats, phase_s=phases))
        t = self.totals
        t["cycles"] += 1
        t["verified"] += len(result.stats.commit_lens)
        t["committed"] += sum(result.stats.commit_lens)
        self._last_end = time.perf_counter()
        bounds, t = [], start_ns
        for name in ("draft", "verify", "commit"):
            end = t + int(result.stats.phase_s[name] * 1e9)
            bounds.append((name, t, end))
            t = end
        self.tracer.emit(CycleEvent(step, start_ns, tuple(bounds), result.stats.commit_lens,
                                    result.stats.simulated))
        out = {}
        for i, (e, toks) in enumerate(zip(entries, result.emitted, strict=True)):
            k = e.req.params.logprobs
            lps = None if k is None else tuple(
                logprobs_of(result.logits[i, :len(toks)], toks, k))
            out[id(e)] = Sampled(tuple(toks), lps)
        return out

    # ------------------------------------------------------------------ PD decode
    def adopt(self, req: Req) -> None:
        """``req`` was imported with its prompt's drafter rows (``handoff.regions()``) written
        into this instance's: the drafter knows every computed position, verify from now on."""
        self._track(req)
        self.handoff.adopt(req.cache.slot)
        self.learned[req.rid] = req.computed_len

    @property
    def accept_length(self) -> float:
        """Mean tokens committed per request per cycle (accepted drafts + bonus), 0 if none."""
        t = self.totals
        return t["committed"] / t["verified"] if t["verified"] else 0.0

    def trim(self, keep: int) -> None:
        """Keep the last ``keep`` cycles' stats (a long-running server); totals stay whole."""
        if len(self.stats) > keep:
            del self.stats[:len(self.stats) - keep]

    # ------------------------------------------------------------------ rows and clean-up
    def _track(self, req: Req) -> None:
        self.layout.track(req)
        self.owner[req.cache.slot] = req.rid

    def _bind(self, req: Req) -> None:
        row = self.row_of.get(req.rid)
        if row is None:
            if not self.free_rows:
                raise RuntimeError("no free speculative row: the budget gives one per running "
                                   "request")
            row = self.row_of[req.rid] = self.free_rows.pop()
        self.store.bind([req.cache.slot], [row])  # (re)bound every cycle: slots can change

    def release(self, rid: str) -> None:
        """Return the store row, the drafter's per-slot state and the marks of ``rid``."""
        row = self.row_of.pop(rid, None)
        if row is not None:
            self.free_rows.append(row)
        for slot in [s for s, owner in self.owner.items() if owner == rid]:
            del self.owner[slot]
            self.store.unbind([slot])
            self.decoder.drafter.release([SpecRequest(row=slot, params=None)])
        self.learned.pop(rid, None)

    def sync(self, running: list[Req]) -> None:
        """Return what requests that stopped running (finish, abort, preemption) still hold."""
        live = {r.rid for r in running}
        for rid in {*self.row_of, *self.learned, *self.owner.values()} - live:
            self.release(rid)
        if not self.row_of:
            self._last_end = None

    def held(self, running: list[Req]) -> dict[str, int]:
        """What is still held after ``sync``: store rows, tracked slots, learned requests."""
        self.sync(running)
        return {"rows": len(self.row_of), "slots": len(self.owner), "learned": len(self.learned)}

    def summary(self) -> dict:
        """Acceptance length, mean phase times and ms per accepted token over all cycles."""
        return summarize(self.stats)


def summarize(stats: list[CycleStats]) -> dict:
    if not stats:
        return {"cycles": 0}
    lens = [c for s in stats for c in s.commit_lens]
    phase_ms = {p: 1e3 * sum(s.phase_s.get(p, 0.0) for s in stats) / len(stats) for p in PHASES}
    cycle_ms = sum(phase_ms.values())
    accept = sum(lens) / len(lens)
    return {"cycles": len(stats), "accept_len": accept, "phase_ms": phase_ms,
            "cycle_ms": cycle_ms, "ms_per_accepted_token": cycle_ms / accept,
            "mean_batch": len(lens) / len(stats), "simulated": any(s.simulated for s in stats)}
