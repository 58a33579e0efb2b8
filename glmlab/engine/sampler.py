"""Moved to ``glmlab.core`` (sampling parameters and the sampler); this alias lasts until the
service imports from there."""

from __future__ import annotations

from glmlab.core import SamplingParams, filtered_probs, make_generator, sample, sample_batch

__all__ = ["SamplingParams", "filtered_probs", "make_generator", "sample", "sample_batch"]
