"""glmlab.kernels.cache_ops"""
