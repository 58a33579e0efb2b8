"""Sampling ops: the logit adjustments a request's sampling parameters ask for, the seeded race
and the logprobs table (``ref.py`` is the specification; ``penalties_triton.py``,
``race_triton.py`` and ``logprobs_triton.py`` the one-pass kernels)."""

from glmlab.kernels.sampling.ref import apply_penalties_ref

__all__ = ["apply_penalties_ref"]
