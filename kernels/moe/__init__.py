"""glmlab.kernels.moe: see ref.py for the specification."""
