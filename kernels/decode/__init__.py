"""glmlab.kernels.decode: in-place KDA window recurrence, the ReplaySSM commit (speculative
decoding's replay of accepted KDA steps) and the paged DSA indexer; see ref.py."""
