"""Moved to ``glmlab.core`` (request, batch and output records); this alias lasts until the
service imports from there. ``StepOutput`` is now ``RequestOutput``."""

from __future__ import annotations

from glmlab.core import (
    Batch,
    CacheTarget,
    Entry,
    FinishReason,
    Phase,
    Req,
    RequestOutput,
    Status,
)

StepOutput = RequestOutput

__all__ = ["Batch", "CacheTarget", "Entry", "FinishReason", "Phase", "Req", "RequestOutput",
           "Status", "StepOutput"]
