"""Sampling ops: the logit adjustments a request's sampling parameters ask for (``ref.py`` is the
specification; ``penalties_triton.py`` the one-pass kernel)."""

from glmlab.kernels.sampling.ref import apply_penalties_ref

__all__ = ["apply_penalties_ref"]
