"""The speculative cycle: draft -> verify -> accept -> commit, batched over requests.

    draft   the drafter proposes S tokens per request (MTP chain: S-1 serial steps; DFlash2: one
            block forward)
    verify  one target forward over each window [anchor, d_1 .. d_S] (D = S + 1 tokens), with a
            ``SpecStateStore`` in the plan: every layer computes the window's outputs, KDA leaves
            the committed state untouched, conv inputs / step inputs / indexer rows are recorded;
            then greedy or rejection-sampling acceptance (or simulated acceptance)
    commit  the cache is rolled to each request's accepted prefix (``commit_lens`` differ per
            request), and the drafter learns the committed positions (MTP draft-extend, DFlash2
            draft-KV projection); it is handed the whole verify window as well
            (``VerifyWindow``), so the MTP extend runs as a uniform step like the verify
    rest    bookkeeping: outputs, stop conditions, next anchors

``SpecDecoder`` runs cycles over any ``CacheLayout`` (a ``Session`` now, the engine's pools too)
and records per-cycle ``CycleStats`` (phase times, commit lengths). It owns no scheduling: callers
choose which requests take part in a cycle.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
from torch.profiler import record_function

from glmlab.core import make_generator, sample
from glmlab.model.glm import GLM5Model
from glmlab.model.plan import ForwardPlan, StepPlan, StepResult
from glmlab.speculative.commit import SpecStateStore
from glmlab.speculative.replay import CommitMode
from glmlab.speculative.sim import SimulatedAcceptance
from glmlab.speculative.types import (
    CacheLayout,
    Drafter,
    SpecRequest,
    TargetStates,
    VerifyWindow,
)
from glmlab.speculative.verify import accept

PHASES = ("draft", "verify", "commit", "rest")


@dataclass(frozen=True)
class CycleStats:
    commit_lens: tuple[int, ...]  # per request: accepted drafts + bonus
    phase_s: dict[str, float]  # seconds per phase
    simulated: bool

    @property
    def cycle_s(self) -> float:
        return sum(self.phase_s.values())

    @property
    def mean_commit(self) -> float:
        return sum(self.commit_lens) / max(1, len(self.commit_lens))


@dataclass(frozen=True)
class CycleResult:
    emitted: list[list[int]]  # per request: the accepted drafts, then the bonus token
    stats: CycleStats  # draft / verify / commit times ("rest" is the caller's)
    timer: PhaseTimer
    logits: torch.Tensor  # [N, D, V] fp32 target logits over each window (row j: token j+1)


class PhaseTimer:
    """Wall time between marks; on CUDA it synchronises at each mark so a phase owns its kernels."""

    def __init__(self, device: torch.device):
        self.sync = device.type == "cuda"
        self.times: dict[str, float] = {}
        self._last = self._now()

    def _now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def mark(self, phase: str) -> None:
        now = self._now()
        self.times[phase] = self.times.get(phase, 0.0) + now - self._last
        self._last = now


class SpecDecoder:
    def __init__(self, model: GLM5Model, layout: CacheLayout, drafter: Drafter,
                 mode: CommitMode | str = CommitMode.REPLAY,
                 simulate: SimulatedAcceptance | None = None, store_rows: int | None = None):
        """``store_rows``: rows of verify state (default: one per state slot, bound 1:1)."""
        cache = layout.cache
        self.model, self.layout, self.drafter, self.simulate = model, layout, drafter, simulate
        self.device = model.embed_tokens.weight.device
        # The KDA commit follows the KDA step: a model on the fused Triton step replays the
        # accepted steps with the Triton kernel too (no host sync), else with the torch reference.
        commit_impl = "triton" if model.backends.kda_step == "triton" else "torch"
        self.store = SpecStateStore(
            model.cfg, store_rows or cache.num_state_slots, drafter.width, CommitMode(mode),
            model.dtype, cache.dtypes.recurrent, self.device,
            num_state_slots=cache.num_state_slots if store_rows else None,
            commit_impl=commit_impl)
        self.stats: list[CycleStats] = []

    @property
    def width(self) -> int:
        return self.drafter.width

    def forward(self, ids: torch.Tensor, plan: ForwardPlan,
                logit_rows: torch.Tensor | None = None) -> StepResult:
        """A target step through the layout's forward, capturing the drafter's layers."""
        return self.layout.forward(StepPlan(ids, plan, logit_rows, self.drafter.capture_layers))

    @torch.inference_mode()
    def start(self, reqs: list[SpecRequest], prompts: list[list[int]]) -> None:
        """Prefill the prompts, sample each first token, and let the drafter learn the prompts."""
        if any(not p for p in prompts):
            raise ValueError("a prompt is empty")
        plan = self.layout.plan([r.row for r in reqs], [len(p) for p in prompts], [0] * len(reqs))
        ids = torch.tensor([t for p in prompts for t in p], device=self.device)
        res = self.forward(ids, plan, plan.last_token_rows())
        hidden, feats, logits = res.hidden, res.features, res.logits
        firsts = []
        for r, p, row in zip(reqs, prompts, logits, strict=True):
            if r.generator is None:
                r.generator = make_generator(r.params, self.device)
            first = sample(row, r.params, r.generator)
            r.committed, r.anchor = len(p), first
            self._emit(r, [first])
            firsts.append(first)
            self._set_length(r)
        sizes = [len(p) for p in prompts]
        self.drafter.extend(reqs, TargetStates(
            positions=[0] * len(reqs), hidden=list(hidden.split(sizes)),
            features=list(feats.split(sizes)), tokens=prompts,
            next_tokens=[p[1:] + [f] for p, f in zip(prompts, firsts, strict=True)]))

    @torch.inference_mode()
    def cycle(self, reqs: list[SpecRequest]) -> CycleResult:
        """Draft, verify, accept and commit one window per request. The cache and the drafter
        move to the committed lengths; ``reqs`` themselves are not changed (the caller applies
        ``emitted``: the tokens, the new anchors, the finish rules)."""
        n, d = len(reqs), self.width
        for r in reqs:
            if r.committed + d > self.layout.capacity(r.row):
                raise ValueError(f"row {r.row}: a verify window of {d} past {r.committed} tokens "
                                 f"exceeds its capacity {self.layout.capacity(r.row)}")
        timer = PhaseTimer(self.device)
        with record_function("spec.draft"):  # profiler ranges: free when none is recording
            proposal = self.drafter.propose(reqs)
        timer.mark("draft")
        anchors = torch.tensor([r.anchor for r in reqs], device=self.device)
        window = torch.cat([anchors[:, None], proposal.tokens], dim=1)  # [N, D]
        rows = [r.row for r in reqs]
        plan = self.layout.plan(rows, [d] * n, [r.committed for r in reqs], verify=self.store)
        with record_function("spec.verify"):
            res = self.forward(window.flatten(), plan)
        hidden, feats, logits = res.hidden, res.features, res.logits.view(n, d, -1)
        if self.simulate is not None:
            acc = self.simulate.accept(logits, proposal.tokens)
        else:
            acc = accept(logits, proposal.tokens, proposal.draft_probs,
                         [r.params for r in reqs], [r.generator for r in reqs])
        timer.mark("verify")
        with record_function("spec.commit"):
            lens = acc.commit_lens.tolist()
            self.store.commit(self.layout.cache, plan.state_slots, acc.commit_lens)
            # one copy of the window's tokens, cut on the host (acc.emitted(i) reads the
            # device once per request: 132 waits per cycle at the reference point)
            rows_host = acc.tokens.tolist()
            emitted = [rows_host[i][:c] for i, c in enumerate(lens)]
            hidden, feats = hidden.view(n, d, -1), feats.view(n, d, -1)
            window_ids = window.tolist()
            self.drafter.extend(reqs, TargetStates(
                positions=[r.committed for r in reqs],
                hidden=[hidden[i, :c] for i, c in enumerate(lens)],
                features=[feats[i, :c] for i, c in enumerate(lens)],
                tokens=[window_ids[i][:c] for i, c in enumerate(lens)],
                next_tokens=emitted,
                # the whole window too: the MTP drafter learns it as one uniform step
                window=VerifyWindow(hidden, acc.tokens, acc.commit_lens, self.store)))
        timer.mark("commit")
        stats = CycleStats(tuple(lens), {p: timer.times.get(p, 0.0) for p in PHASES},
                           simulated=self.simulate is not None)
        return CycleResult(emitted, stats, timer, logits)

    def step(self, reqs: list[SpecRequest]) -> CycleStats | None:
        """One cycle for the unfinished requests of ``reqs``, then their bookkeeping."""
        live = [r for r in reqs if not r.finished]
        if not live:
            return None
        result = self.cycle(live)
        for r, toks in zip(live, result.emitted, strict=True):
            r.committed += len(toks)
            r.anchor = toks[-1]
            self._emit(r, toks)
            self._set_length(r)
        done = [r for r in live if r.finished]
        if done:
            self.drafter.release(done)
        result.timer.mark("rest")
        stats = dataclasses.replace(result.stats, phase_s={
            p: result.timer.times.get(p, 0.0) for p in PHASES})
        self.stats.append(stats)
        return stats

    def _emit(self, r: SpecRequest, tokens: list[int]) -> None:
        stop = set(r.params.stop_token_ids) | (set() if r.params.ignore_eos
                                               else set(self.model.cfg.eos_token_ids))
        for t in tokens:
            if r.finished:
                return
            r.output.append(t)
            r.finished = t in stop or len(r.output) >= r.params.max_new_tokens

    def _set_length(self, r: SpecRequest) -> None:
        setter = getattr(self.layout, "set_length", None)
        if setter is not None:
            setter(r.row, r.committed)

    def generate(self, prompts: dict[int, list[int]], params) -> dict[int, list[int]]:
        """Run whole requests (row -> prompt) to completion; returns row -> output tokens."""
        reqs = [SpecRequest(row=row, params=params) for row in prompts]
        self.start(reqs, list(prompts.values()))
        while any(not r.finished for r in reqs):
            self.step(reqs)
        return {r.row: r.output for r in reqs}
