"""Device-to-host synchronisations of a block of CUDA work, as torch's sync debug mode sees them.

torch reports a synchronising call (``.item()``, a device-to-host copy, ``nonzero``...) when its
sync debug mode is on; switching the mode on also prints a notice that the mode is a prototype,
which a test that turns warnings into errors would take for a sync. ``sync_debug`` silences
that notice only; ``count_host_syncs`` counts the real reports. GPU only.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

_NOTICE = "Synchronization debug mode is a prototype"
REPORT = "called a synchronizing CUDA operation"


def _set(mode: str) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NOTICE)
        torch.cuda.set_sync_debug_mode(mode)


@contextmanager
def sync_debug(mode: str = "error") -> Iterator[None]:
    """torch's sync debug ``mode`` ("warn" or "error") inside the block, default after it."""
    _set(mode)
    try:
        yield
    finally:
        _set("default")


def count_host_syncs(fn: Callable[[], object]) -> int:
    """How many synchronising calls ``fn`` makes (it runs once)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with sync_debug("warn"):
            fn()
    return sum(REPORT in str(w.message) for w in seen)
