"""Trace events: frozen records of what the engine did, cheap to make and easy to serialise.

- ``StepEvent``: one engine step: its batch (which requests, which phase, how many tokens), its
  wall time, and the pools afterwards (pages used / in the tree / evictable, state slots).
- ``RequestEvent``: a request's lifecycle (add, admit, preempt, finish, abort).
- ``CycleEvent``: one speculative cycle (``glmlab.speculative``): when its draft / verify / commit phases
  ran and how many tokens each request committed.

Events hold plain values only (no tensors, no live objects), so a trace can be written, read back
and plotted anywhere. This module knows nothing about how events are stored or shown.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from glmlab.cache.hybrid import PoolUsage


@dataclass(frozen=True)
class StepEvent:
    step: int
    start_ns: int
    end_ns: int
    phase: str  # "prefill" (any prefill entry: a mixed batch) or "decode"
    num_seqs: int
    prefill_tokens: int
    decode_tokens: int
    entries: tuple[tuple[str, str, int, int], ...]  # (rid, phase, start position, num tokens)
    pool: PoolUsage

    @classmethod
    def of(cls, batch, pool: PoolUsage, start_ns: int, end_ns: int) -> StepEvent:
        entries = tuple((e.req.rid, e.phase.value, e.start, e.num_tokens) for e in batch.entries)
        prefill = sum(n for _, p, _, n in entries if p == "prefill")
        return cls(step=batch.step, start_ns=start_ns, end_ns=end_ns, phase=batch.phase.value,
                   num_seqs=len(entries), prefill_tokens=prefill,
                   decode_tokens=sum(n for _, _, _, n in entries) - prefill,
                   entries=entries, pool=pool)

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    def to_dict(self) -> dict:
        return {"type": "step", **asdict(self)}


@dataclass(frozen=True)
class RequestEvent:
    t_ns: int
    kind: str  # add | admit | preempt | stop | length | abort | prefilled
    rid: str
    step: int
    detail: int = 0  # admit: prompt tokens reused from the radix tree

    @classmethod
    def now(cls, kind: str, rid: str, step: int, detail: int = 0) -> RequestEvent:
        return cls(time.perf_counter_ns(), kind, rid, step, detail)

    def to_dict(self) -> dict:
        return {"type": "request", **asdict(self)}


@dataclass(frozen=True)
class CycleEvent:
    step: int
    start_ns: int
    phases: tuple[tuple[str, int, int], ...]  # (draft | verify | commit, start_ns, end_ns)
    commit_lens: tuple[int, ...]  # per request: accepted drafts + bonus
    simulated: bool  # simulated acceptance (glmlab.speculative.sim): not the target's own output

    @property
    def end_ns(self) -> int:
        return self.phases[-1][2] if self.phases else self.start_ns

    def to_dict(self) -> dict:
        return {"type": "cycle", **asdict(self)}
