"""What an engine reports about itself: pool occupancy and the tokens it computed.

``EngineStats`` is one snapshot (``Engine.stats()``: the HTTP service's gauges and counters, the
benchmarks' checks); ``TokenCounts`` accumulates, step by step, the tokens the engine ran, split
as SGLang's ``sglang:realtime_tokens_total`` splits them, so "n samples of one prompt cost one
prefill" is something anyone can read off /metrics. Knows batches, not the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from glmlab.core import Batch, Phase, Sampled


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    parked: int  # awaiting an import, or held after prefill for export
    pages_used: int
    pages_total: int
    pages_tree: int  # held by the radix tree (shared, or cached for later)
    pages_evictable: int
    state_slots_used: int
    state_slots_total: int
    state_checkpoints: int
    prompt_tokens: int  # admitted so far
    cached_tokens: int  # of them, served from the radix tree
    hit_rate: float
    prefill_compute_tokens: int = 0  # positions run in prefill chunks since start
    decode_tokens: int = 0  # tokens sampled by decode and verify steps since start
    pages_allocated: int = 0  # KV pages handed out since start (shared pages count once)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class TokenCounts:
    """Tokens as the engine computed them (SGLang's ``sglang:realtime_tokens_total`` modes):
    prompt positions run by prefill chunks (a prompt with n samples: once), tokens sampled by
    decode and verify steps."""

    prefill_compute: int = 0
    decode: int = 0

    def add(self, batch: Batch, sampled: Sequence[Sampled]) -> None:
        it = iter(sampled)
        for e in batch.entries:
            s = next(it) if e.samples else None
            if e.phase is Phase.PREFILL:
                self.prefill_compute += e.num_tokens
            elif s is not None:
                self.decode += len(s.tokens)
