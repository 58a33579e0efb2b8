"""Speculative-decoding settings: which drafter, how wide a verify window, how state is committed.

One frozen dataclass; CLI flags are generated from its fields (``--spec-num-steps``, ...).

- ``mtp``: the checkpoint's MTP layer as a chain drafter, top-k 1, ``num_steps`` serial steps,
  verify width ``num_steps + 1`` (MTP516: 5 steps / width 6; MTP718: 7 steps / width 8).
- ``dflash2``: a DFlash2 block drafter (``draft_path``), one forward per cycle proposing
  ``block_size - 1`` tokens, verify width ``block_size``; its draft KV in ``draft_kv_dtype``.

``simulate_accept_len > 0`` replaces the verifier's decision by a simulated commit length with that
mean (``simulate_mode`` fixed: the floor/ceil mix that reaches the mean; sampled: a constant
per-draft acceptance rate). It exists for cycle-time studies on random weights; every output of a
simulated run says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Algorithm = Literal["mtp", "dflash2"]


@dataclass(frozen=True)
class SpecConfig:
    algorithm: Algorithm = "mtp"
    num_steps: int = 7  # MTP chain length S
    block_size: int = 8  # DFlash2 block B (anchor + B-1 drafts)
    commit: Literal["replay", "snapshot"] = "replay"
    draft_path: str | None = None  # DFlash2 draft checkpoint directory
    draft_kv_dtype: Literal["bf16", "fp8"] = "bf16"
    simulate_accept_len: float = 0.0  # 0 = real acceptance
    simulate_mode: Literal["fixed", "sampled"] = "fixed"

    def __post_init__(self) -> None:
        if self.algorithm not in ("mtp", "dflash2"):
            raise ValueError(f"algorithm must be mtp or dflash2, got {self.algorithm!r}")
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + drafts), got {self.block_size}")
        if self.commit not in ("replay", "snapshot"):
            raise ValueError(f"commit must be replay or snapshot, got {self.commit!r}")
        if self.draft_kv_dtype not in ("bf16", "fp8"):
            raise ValueError(f"draft_kv_dtype must be bf16 or fp8, got {self.draft_kv_dtype!r}")
        if self.simulate_mode not in ("fixed", "sampled"):
            raise ValueError(f"simulate_mode must be fixed or sampled, got {self.simulate_mode!r}")
        if self.simulate_accept_len and not 1.0 <= self.simulate_accept_len <= self.width:
            raise ValueError(f"simulate_accept_len must lie in [1, {self.width}] (commit length "
                             f"= accepted drafts + bonus), got {self.simulate_accept_len}")

    @property
    def width(self) -> int:
        """Verify window D: the anchor plus the drafts."""
        return self.num_steps + 1 if self.algorithm == "mtp" else self.block_size

    @property
    def simulated(self) -> bool:
        return self.simulate_accept_len > 0

    @property
    def name(self) -> str:
        """MTP718-style name for MTP chains (steps, top-k 1, width); DFlash2-B<width> for blocks."""
        if self.algorithm == "mtp":
            return f"MTP{self.num_steps}1{self.width}"
        return f"DFlash2-B{self.block_size}"
