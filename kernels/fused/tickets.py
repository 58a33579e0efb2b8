"""Per-device split-reduction counters shared by glmlab's "last program reduces" kernels.

A kernel whose output tile is computed by several programs (split-K GEMM, split-expert router,
split-channel mHC coefficients) writes partials, then each program takes a ticket from the tile's
counter; the one drawing the last ticket reduces the partials in a fixed order and resets the
counter to zero. So the buffer is all zeros between launches, and any such kernel may use it, as
long as two of them never run concurrently on different streams (glmlab runs one stream per step).
Being allocated once and never reallocated, it is safe to bake into a CUDA graph.
"""

from __future__ import annotations

import torch

MAX_TILES = 1 << 16
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def ticket_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """The zeroed int32 counter buffer of ``device`` (at least ``tiles`` entries)."""
    if tiles > MAX_TILES:
        raise ValueError(f"{tiles} split tiles exceed the counter buffer ({MAX_TILES})")
    device = torch.device(device)
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
    return _COUNTERS[device]
