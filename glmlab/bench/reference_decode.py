"""The reference decode point on one emulated rank: DFlash2-B8, MTP718 and plain decode cycles.

``build_rank`` draws rank r of TP/EP (``glmlab.distributed.random_shard`` with stand-in groups from
``glmlab.distributed.standin``: the full-size random FP8 model's shard, MTP layer included) and
the rank's shard of a random DFlash2 draft at its assumed shape (5 layers of 32 query / 8 KV heads
x 128, MLP 3 x hidden, BF16: ``glmlab.speculative.dflash_io.draft_shape``; split by
``glmlab.distributed.draft_tp``). ``DecodeBench`` puts them on a ``SharedPrefixLayout`` (64K shared
prefix stored once, FP8 KV, BF16 state) and, per algorithm and batch:

1. one *census* cycle, eager, with the recorder on: the collectives of a cycle by phase, and
   the routed experts of this rank its tokens went to;
2. ``warmup`` cycles replaying CUDA graphs of the verify (decode) step, captured for every batch
   of the sweep on first use (``CudaGraphRunner``: Backends.fast() only; eager otherwise);
3. ``cycles`` timed cycles: mean wall time per phase (draft / verify / commit / rest) and commit
   length (simulated acceptance: 7.03 for DFlash2 block 8, 7.37 for MTP718; plain decode 1);
4. for the ``detail_batch`` only, one more eager cycle timed per sublayer kind (KDA, DSA, MoE,
   dense MLP: ``LayerTimer``), the draft's and the commit's own layers not included; with a
   ``profile_dir``, one more eager cycle under the torch profiler, its CUDA kernels tabled
   (``profile-ALGORITHM.txt``: where the cycle's device time goes).

Draft and commit run eagerly (glmlab captures only target steps). Every number is rank r's
compute; the outputs are not the model's (partial sums stay partial). Knows nothing about rows.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from glmlab.bench.layer_timer import LayerTimer
from glmlab.bench.profile_table import write_profile
from glmlab.bench.reference_layout import SharedPrefix, SharedPrefixLayout, fill_random_
from glmlab.cache.storage import CacheDtypes
from glmlab.core import SamplingParams
from glmlab.distributed.draft_tp import shard_draft
from glmlab.distributed.parallel import ParallelLayout
from glmlab.distributed.random_shard import random_tp_model
from glmlab.distributed.standin import CollectiveRecorder, emulated_groups
from glmlab.engine.cuda_graph import CudaGraphRunner
from glmlab.model.moe import Router
from glmlab.model.plan import StepPlan
from glmlab.presets import preset
from glmlab.speculative.cycle import PHASES, SpecDecoder
from glmlab.speculative.dflash import DFlashDrafter, DFlashDraftModel
from glmlab.speculative.dflash_io import init_random_draft_, random_draft_config
from glmlab.speculative.draft_kv import DraftKVLayout, DraftKVStore
from glmlab.speculative.mtp import MTPDrafter
from glmlab.speculative.replay import CommitMode
from glmlab.speculative.sim import SimulatedAcceptance
from glmlab.speculative.types import SpecRequest

ACCEPT = {"dflash2": 7.03, "mtp": 7.37}  # the reference deployment's, at verify width 8
WIDTH = 8


@dataclass(frozen=True)
class RankSpec:
    preset: str = "full"
    tp: int = 4  # TP4 with EP4, the reference decode instance
    rank: int = 0
    fp8_mode: str = "keep"
    dtype: torch.dtype = torch.bfloat16
    device: str = "cuda"
    draft_layers: int = 5
    draft_kv_heads: int | None = None  # default: draft_shape's (8 at real width)
    seed: int = 0


def build_rank(spec: RankSpec, recorder: CollectiveRecorder):
    """(target shard with MTP, draft shard) of rank ``spec.rank``."""
    groups = emulated_groups(ParallelLayout(tp=spec.tp, ep=spec.tp), spec.rank, recorder)
    model = random_tp_model(preset(spec.preset), groups, seed=spec.seed, fp8=True,
                            fp8_mode=spec.fp8_mode, dtype=spec.dtype, device=spec.device)
    cfg = random_draft_config(model.cfg, block_size=WIDTH, num_layers=spec.draft_layers)
    if spec.draft_kv_heads:
        cfg = dataclasses.replace(cfg, num_kv_heads=spec.draft_kv_heads)
    with torch.device(spec.device):
        draft = DFlashDraftModel(cfg).to(spec.dtype)
    draft = init_random_draft_(draft, spec.seed).to(spec.dtype)
    return model, shard_draft(draft, groups.info.tp_rank, spec.tp, groups.tp)


class _Scoped:
    """A drafter whose collectives are tagged: proposals ``draft``, learning ``commit``."""

    def __init__(self, inner, recorder: CollectiveRecorder):
        self.inner, self.recorder = inner, recorder
        self.width, self.capture_layers = inner.width, inner.capture_layers

    def propose(self, reqs):
        with self.recorder.scope("draft"):
            return self.inner.propose(reqs)

    def extend(self, reqs, states):
        with self.recorder.scope("commit"):
            return self.inner.extend(reqs, states)

    def release(self, reqs):
        return self.inner.release(reqs)


@dataclass
class PointResult:
    algorithm: str
    batch: int
    phase_ms: dict[str, float]
    accept_len: float
    calls: list  # the census cycle's collectives
    cycles: int
    sublayer_ms: dict[str, float] | None = None  # eager verify, per sublayer kind
    experts_hit: dict[int, int] | None = None  # MoE layer -> distinct experts in the verify

    @property
    def compute_ms(self) -> float:
        return sum(self.phase_ms.values())


class DecodeBench:
    def __init__(self, model, draft: DFlashDraftModel, work: SharedPrefix, dtypes: CacheDtypes,
                 recorder: CollectiveRecorder, graphs: bool, seed: int = 0,
                 profile_dir: str | None = None):
        self.model, self.draft, self.work, self.recorder = model, draft, work, recorder
        self.use_graphs, self.seed, self.profile_dir = graphs, seed, profile_dir
        self.layout = SharedPrefixLayout(model, work, dtypes, recorder)
        c = draft.cfg
        self.draft_kv = DraftKVStore(DraftKVLayout(c.num_layers, c.num_kv_heads, c.head_dim,
                                                   "bf16"),
                                     self.layout.cache.num_token_slots, self.layout.cache.device)
        fill_random_(self.layout.cache, self.draft_kv, seed)
        self.device = self.layout.cache.device
        self.graph_bytes = 0  # the last sweep's CUDA graphs (pool, buffers, outputs)

    # ------------------------------------------------------------------ requests
    def requests(self, batch: int) -> list[SpecRequest]:
        g = torch.Generator().manual_seed(self.seed + batch)
        anchors = torch.randint(0, self.model.cfg.vocab_size, (batch,), generator=g).tolist()
        params = SamplingParams(max_new_tokens=10**9, ignore_eos=True)
        return [SpecRequest(row=i + 1, params=params, committed=self.work.prompt_len,
                            anchor=anchors[i]) for i in range(batch)]

    def decoder(self, algorithm: str) -> SpecDecoder:
        if algorithm == "dflash2":
            inner = DFlashDrafter(self.model, self.draft, self.layout, self.draft_kv)
        else:
            inner = MTPDrafter(self.model, self.layout, WIDTH - 1)
        sim = SimulatedAcceptance(ACCEPT[algorithm], WIDTH, "fixed", self.seed)
        return SpecDecoder(self.model, self.layout, _Scoped(inner, self.recorder),
                           CommitMode.REPLAY, simulate=sim)

    def _seed_mtp(self, dec: SpecDecoder, reqs: list[SpecRequest]) -> None:
        """An MTP chain start per request (what the last cycle's draft-extend would leave)."""
        mtp = dec.drafter.inner
        if not isinstance(mtp, MTPDrafter):
            return
        g = torch.Generator(self.device).manual_seed(self.seed)
        for r in reqs:
            hidden = torch.randn(self.model.cfg.hidden_size, generator=g, device=self.device)
            mtp.set_chain_start(r.row, hidden.to(self.model.dtype), r.anchor)

    # ------------------------------------------------------------------ runs
    def _graphs(self, batches: list[int]) -> CudaGraphRunner | None:
        if not self.use_graphs:
            return None
        return CudaGraphRunner(self.model, self.layout.cache, max(batches),
                               self.layout.max_pages, sorted(set(batches)))

    def sweep(self, algorithm: str, batches: list[int], cycles: int, warmup: int,
              deadline: float | None = None, detail_batch: int | None = None):
        """Yield a ``PointResult`` per batch (stops early past ``deadline``, a perf_counter)."""
        runner = self._graphs(batches)
        dec = self.decoder(algorithm) if algorithm != "decode" else None
        try:
            for batch in batches:
                if deadline is not None and time.perf_counter() > deadline:
                    print(f"time budget spent: {algorithm} b{batch} and later skipped",
                          flush=True)
                    return
                detail = batch == detail_batch
                if dec is None:
                    res = self._decode_point(runner, batch, cycles, warmup, detail)
                else:
                    res = self._spec_point(dec, runner, algorithm, batch, cycles, warmup, detail)
                self.graph_bytes = runner.memory_bytes() if runner is not None else 0
                yield res
        finally:
            self.layout.graphs = None
            del dec, runner
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _census(self, run):
        """One eager run with the recorder on: its collectives, and the routed experts of this
        rank each MoE layer's tokens went to (for the roofline)."""
        self.layout.graphs, hits, hooks = None, {}, []
        moes = [m for m in self.model.layers.modules()
                if isinstance(getattr(m, "gate", None), Router)]
        for i, m in enumerate(moes):
            lo = getattr(m, "expert_start", 0)
            hi = lo + getattr(m, "num_local", m.experts.w13.shape[0])

            def hook(mod, args, out, i=i, lo=lo, hi=hi):
                ids = torch.unique(out[1])
                hits[i] = int(((ids >= lo) & (ids < hi)).sum())
            hooks.append(m.gate.register_forward_hook(hook))
        self.recorder.clear()
        try:
            run()
        finally:
            for h in hooks:
                h.remove()
        return self.recorder.take(), (hits or None)

    def _sublayers(self, run) -> dict[str, float]:
        """Milliseconds per sublayer kind of one more eager run (kernels already compiled)."""
        self.layout.graphs = None
        with self.recorder.paused(), LayerTimer(self.model) as timer:
            run()
            return timer.by_kind()

    def _profile(self, algorithm: str, batch: int, run) -> None:
        """One more eager run under the torch profiler: ``profile_dir/profile-ALGORITHM.txt``."""
        self.layout.graphs = None
        with self.recorder.paused():
            write_profile(run, Path(self.profile_dir) / f"profile-{algorithm}.txt",
                          f"{algorithm} batch {batch}, one eager cycle (no CUDA graphs)")

    def _spec_point(self, dec: SpecDecoder, runner, algorithm: str, batch: int, cycles: int,
                    warmup: int, detail: bool) -> PointResult:
        reqs = self.requests(batch)
        self._seed_mtp(dec, reqs)
        calls, hits = self._census(lambda: dec.step(reqs))
        self.layout.graphs = runner
        dec.stats.clear()
        with self.recorder.paused():
            for _ in range(warmup):
                dec.step(reqs)
            dec.stats.clear()
            for _ in range(cycles):
                dec.step(reqs)
        stats = list(dec.stats)
        sub = self._sublayers(lambda: dec.step(reqs)) if detail else None
        if detail and self.profile_dir:
            self._profile(algorithm, batch, lambda: dec.step(reqs))
        phase = {p: 1e3 * sum(s.phase_s[p] for s in stats) / len(stats) for p in PHASES}
        accept = sum(s.mean_commit for s in stats) / len(stats)
        return PointResult(algorithm, batch, phase, accept, calls, len(stats), sub, hits)

    def _decode_point(self, runner, batch: int, steps: int, warmup: int,
                      detail: bool) -> PointResult:
        reqs = self.requests(batch)
        plan = self.layout.plan([r.row for r in reqs], [1] * batch, [r.committed for r in reqs])
        ids = torch.tensor([r.anchor for r in reqs], device=self.device)

        def step():
            res = self.layout.forward(StepPlan(ids, plan))
            return res.logits.argmax(-1)

        calls, hits = self._census(step)
        self.layout.graphs = runner
        with self.recorder.paused():
            for _ in range(max(1, warmup)):
                step()
            _sync(self.device)
            t = time.perf_counter()
            for _ in range(steps):
                step()
            _sync(self.device)
        ms = (time.perf_counter() - t) / steps * 1e3
        sub = self._sublayers(step) if detail else None
        if detail and self.profile_dir:
            self._profile("decode", batch, step)
        phase = dict.fromkeys(PHASES, 0.0) | {"verify": ms}
        return PointResult("decode", batch, phase, 1.0, calls, steps, sub, hits)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
