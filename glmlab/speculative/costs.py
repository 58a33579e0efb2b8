"""The reference deployment's speculative cost model, and its published MTP718 / DFlash2 block-8
numbers.

    output throughput ~ active requests x acceptance length / cycle time
    amortised cost    = cycle time / acceptance length        (ms per accepted token)

where the acceptance length is the mean commit length (accepted drafts + bonus). ``REFERENCE``
holds the
the reference deployment's Figure 3 phase means on 4 x H200 at ~128 active requests; "rest" is what
the reference deployment lists as
"cache updates, state commits, and stage gaps" (cycle - draft - verify).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CycleCost:
    draft_ms: float
    verify_ms: float
    cycle_ms: float
    accept_len: float

    @property
    def rest_ms(self) -> float:
        return self.cycle_ms - self.draft_ms - self.verify_ms

    @property
    def ms_per_token(self) -> float:
        return self.cycle_ms / self.accept_len

    def tokens_per_s(self, active_requests: int) -> float:
        return active_requests * self.accept_len / (self.cycle_ms / 1e3)

    @classmethod
    def of_row(cls, row: dict) -> CycleCost:
        """From a ``glmlab.bench.spec`` row (commit folded into rest, as the reference
        deployment reports it)."""
        p = row["phase_ms"]
        return cls(p["draft"], p["verify"], row["cycle_ms"], row["accept_len"])


REFERENCE = {
    "MTP718": CycleCost(draft_ms=9.13, verify_ms=65.16, cycle_ms=86.94, accept_len=7.37),
    "DFlash2-B8": CycleCost(draft_ms=3.15, verify_ms=66.30, cycle_ms=74.14, accept_len=7.03),
}
# output tok/s, same service otherwise
REFERENCE_THROUGHPUT = {"MTP718": 10570, "DFlash2-B8": 11459}


def compare(rows: list[dict]) -> list[dict]:
    """Our measured rows beside the reference's numbers, one dict per (config, source)."""
    out = []
    for row in rows:
        ours = CycleCost.of_row(row)
        label = row["config"] + (f" ({row['draft_kv_dtype']} draft KV)"
                                 if "draft_kv_dtype" in row else "")
        out.append({"config": label, "source": f"glmlab {row['preset']} {row['device']}"
                    + (" [simulated]" if row.get("simulated") else ""), **_fields(ours)})
    for name, cost in REFERENCE.items():
        out.append({"config": name, "source": "reference deployment, 4xH200 (Figure 3)",
                    **_fields(cost)})
    return out


def _fields(c: CycleCost) -> dict:
    return {"draft_ms": round(c.draft_ms, 3), "verify_ms": round(c.verify_ms, 3),
            "rest_ms": round(c.rest_ms, 3), "cycle_ms": round(c.cycle_ms, 3),
            "accept_len": round(c.accept_len, 3), "ms_per_token": round(c.ms_per_token, 3)}


def at_measured_acceptance(accepted: list[dict],
                           costs: dict[str, CycleCost] = REFERENCE) -> list[dict]:
    """The cost model fed a measured acceptance: each cycle in ``costs`` (the reference
    deployment's by default) at the acceptance a trained model measured for the same drafter
    (``glmlab.train.acceptance`` rows, greedy), beside the acceptance it was published with."""
    measured = {r["config"]: r["accept_len"] for r in accepted if r["temperature"] == 0.0}
    out = []
    for name, cost in costs.items():
        if name in measured:
            at = CycleCost(cost.draft_ms, cost.verify_ms, cost.cycle_ms, measured[name])
            out.append({"config": name, "source": "published cycle, measured acceptance",
                        **_fields(at)})
            out.append({"config": name, "source": "published cycle and acceptance",
                        **_fields(cost)})
    return out
