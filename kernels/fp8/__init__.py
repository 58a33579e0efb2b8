"""glmlab.kernels.fp8: see ref.py for the specification."""
