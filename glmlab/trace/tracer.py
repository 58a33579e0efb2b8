"""Tracers: where events go. The default does nothing; ``RecordingTracer`` keeps them and writes
them as JSONL (one event per line) or as a Chrome/Perfetto trace (open it at ui.perfetto.dev).

In the Chrome trace, steps are complete events ("X") on one track, pool occupancy is a set of
counter tracks ("C": pages used / in the tree / evictable, state slots used), and request
lifecycle events are instants ("i") on a second track, speculative cycles' draft / verify /
commit phases slices on a third.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from glmlab.cache.hybrid import PoolUsage
from glmlab.trace.events import CycleEvent, RequestEvent, StepEvent


class Tracer:
    """No-op: the engine calls ``emit`` and ``on_step`` unconditionally, so tracing costs nothing
    when off (a step's pool usage, which walks the radix tree, is only computed when recorded)."""

    def emit(self, event) -> None:
        pass

    def on_step(self, batch, usage: Callable[[], PoolUsage], start_ns: int, end_ns: int) -> None:
        pass


NULL_TRACER = Tracer()


class RecordingTracer(Tracer):
    def __init__(self):
        self.events: list[StepEvent | RequestEvent] = []

    def emit(self, event) -> None:
        self.events.append(event)

    def on_step(self, batch, usage: Callable[[], PoolUsage], start_ns: int, end_ns: int) -> None:
        self.events.append(StepEvent.of(batch, usage(), start_ns, end_ns))

    @property
    def steps(self) -> list[StepEvent]:
        return [e for e in self.events if isinstance(e, StepEvent)]

    @property
    def cycles(self) -> list[CycleEvent]:
        return [e for e in self.events if isinstance(e, CycleEvent)]

    def write_jsonl(self, path: str | Path) -> Path:
        path = Path(path)
        with path.open("w") as f:
            for e in self.events:
                f.write(json.dumps(e.to_dict()) + "\n")
        return path

    def chrome_trace(self) -> dict:
        t0 = min((_start(e) for e in self.events), default=0)
        us = lambda ns: (ns - t0) / 1e3  # noqa: E731
        out = []
        for e in self.events:
            if isinstance(e, StepEvent):
                out.append({"name": f"{e.phase} x{e.num_seqs}", "ph": "X", "pid": 1, "tid": 1,
                            "ts": us(e.start_ns), "dur": (e.end_ns - e.start_ns) / 1e3,
                            "args": {"step": e.step, "prefill_tokens": e.prefill_tokens,
                                     "decode_tokens": e.decode_tokens}})
                p = e.pool
                out.append({"name": "KV pages", "ph": "C", "pid": 1, "ts": us(e.end_ns),
                            "args": {"used": p.pages_total - p.pages_free,
                                     "tree": p.pages_tree, "evictable": p.pages_evictable}})
                out.append({"name": "state slots", "ph": "C", "pid": 1, "ts": us(e.end_ns),
                            "args": {"used": p.slots_total - p.slots_free,
                                     "checkpoints": p.checkpoints}})
            elif isinstance(e, CycleEvent):
                sim = " (simulated)" if e.simulated else ""
                out += [{"name": name + sim, "ph": "X", "pid": 1, "tid": 3, "ts": us(a),
                         "dur": (b - a) / 1e3, "args": {"step": e.step,
                                                        "commit_lens": list(e.commit_lens)}}
                        for name, a, b in e.phases]
            else:
                out.append({"name": f"{e.kind} {e.rid}", "ph": "i", "s": "t", "pid": 1,
                            "tid": 2, "ts": us(e.t_ns), "args": {"step": e.step,
                                                                "detail": e.detail}})
        names = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": t, "args": {"name": n}}
                 for t, n in ((1, "engine steps"), (2, "requests"), (3, "speculative cycles"))]
        return {"traceEvents": names + out, "displayTimeUnit": "ms"}

    def write_chrome_trace(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.chrome_trace()))
        return path


def _start(e) -> int:
    return e.start_ns if isinstance(e, StepEvent | CycleEvent) else e.t_ns
