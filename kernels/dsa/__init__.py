"""glmlab.kernels.dsa: see ref.py for the specification."""
