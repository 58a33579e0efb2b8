"""glmlab.kernels.fused: mHC sites, RMSNorm (+ residual), the MoE router; see ref.py."""
