"""glmlab.kernels.decode: in-place KDA window recurrence and the paged DSA indexer; see ref.py."""
