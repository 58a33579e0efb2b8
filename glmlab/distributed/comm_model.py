"""Price a rank's recorded collectives: microseconds per call from a ``CommTable``.

A stand-in rank (``standin``) records what it would have communicated; ``CommModel.price`` turns
those records into time, by phase and by kind, with the table's source named in the result, so a
benchmark can report compute (measured) and communication (modelled) side by side and their sum.

The sum assumes **no overlap**: every collective sits on the critical path after the compute
before it, as a TP decode step's all-reduces do (each layer's output is reduced before the next
layer reads it). Overlap (SGLang's two-batch overlap, async TP) could hide up to
``min(compute, comm)``; ``overlap_bounds`` gives both ends. The model knows nothing about
contention between collectives and kernels, nor about SGLang's custom all-reduce (one-shot /
two-shot over NVLink P2P), which beats NCCL below a few MB: for such messages the NCCL curve is an
upper bound of what the reference deployment pays.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from glmlab.distributed.comm_table import SOURCES, CommTable
from glmlab.distributed.standin import Collective


@dataclass(frozen=True)
class CommModel:
    table: CommTable

    @classmethod
    def published(cls) -> CommModel:
        return cls(CommTable.published())

    def time_us(self, call: Collective) -> float:
        if call.kind == "barrier" or call.ranks == 1:
            return 0.0
        return self.table.curve(call.kind, call.ranks).time_us(call.bytes)

    def price(self, calls: list[Collective]) -> dict:
        """Total and per-phase / per-kind milliseconds, counts, bytes and the sources used."""
        by_phase: dict[str, float] = defaultdict(float)
        by_kind: dict[str, dict] = defaultdict(lambda: {"count": 0, "bytes": 0, "ms": 0.0})
        sources = set()
        for c in calls:
            ms = self.time_us(c) / 1e3
            by_phase[c.phase or "-"] += ms
            k = by_kind[f"{c.kind}x{c.ranks}"]
            k["count"] += 1
            k["bytes"] += c.bytes
            k["ms"] += ms
            if c.kind != "barrier" and c.ranks > 1:
                sources.add(self.table.curve(c.kind, c.ranks).source)
        return {"comm_ms": sum(by_phase.values()), "by_phase": dict(by_phase),
                "by_kind": {k: dict(v) for k, v in by_kind.items()},
                "sources": {s: _describe(s) for s in sorted(sources)}}


def _describe(source: str) -> str:
    base, _, lent = source.partition(" (")
    return SOURCES.get(base, base) + (f" [{lent[:-1]} lent to another kind]" if lent else "")


def overlap_bounds(compute_ms: float, comm_ms: float) -> dict:
    """The cycle with no overlap (what rows report) and with perfect overlap (the floor)."""
    return {"no_overlap_ms": compute_ms + comm_ms, "full_overlap_ms": max(compute_ms, comm_ms),
            "overlap_could_save_ms": min(compute_ms, comm_ms)}
