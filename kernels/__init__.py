"""glmlab.kernels: fast ops and their torch references, one folder per op family."""
