"""glmlab.kernels.kda: see ref.py for the specification."""
