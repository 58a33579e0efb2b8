"""Manifold-constrained hyper-connections (mHC): N residual streams instead of one.

Each decoder layer has two mHC sites (before attention, before the FFN). A site reads the N streams
of a token, and from one projection of their (unweighted-RMS-normalised) concatenation derives

- ``pre``  [N]:   how to collapse the streams into the sublayer input u = sum_i pre_i X_i,
- ``post`` [N]:   how much of the sublayer output y each stream receives (range (0, 2)),
- ``comb`` [N,N]: a near doubly-stochastic mixing of the old streams (softmax, then Sinkhorn).

New streams: X'_k = post_k * y + sum_j comb[j, k] X_j. All coefficient maths is fp32; the final
mixing casts ``post`` and ``comb`` to the activation dtype first, as transformers does. The maths
is ``kernels/fused/ref.py``; the ``mhc`` backend op (``glmlab.model.backends``) runs a site either
as those references or as the fused kernels, where one site's write-back is computed together with
the next site's coefficients (the model carries it as ``pending`` = (y, post, comb)).
"""

from __future__ import annotations

import torch
from torch import nn

from glmlab.config import MHCConfig
from glmlab.kernels.fused.ref import mhc_coefficients_ref, mhc_collapse_ref, mhc_expand_ref
from glmlab.model import torch_ops

Pending = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (y, post, comb) not yet written back


class HyperConnection(nn.Module):
    def __init__(self, cfg: MHCConfig, hidden_size: int, norm_eps: float):
        super().__init__()
        self.n, self.iters, self.eps, self.norm_eps = (
            cfg.num_streams,
            cfg.sinkhorn_iters,
            cfg.eps,
            norm_eps,
        )
        self.fn = nn.Parameter(torch.empty(cfg.proj_dim, cfg.num_streams * hidden_size))
        self.base = nn.Parameter(torch.empty(cfg.proj_dim))
        self.scale = nn.Parameter(torch.empty(3))
        self.ops = torch_ops.mhc

    def coefficients(self, streams: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """streams [T, N, D] -> pre [T, N], post [T, N], comb [T, N, N] (all fp32)."""
        return mhc_coefficients_ref(streams, self.fn, self.base, self.scale, self.iters, self.eps,
                                    self.norm_eps)

    def collapse(self, streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        """u [T, D] = sum_i pre_i X_i (in fp32, cast to the stream dtype)."""
        return mhc_collapse_ref(streams, pre)

    def expand(
        self, streams: torch.Tensor, y: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
    ) -> torch.Tensor:
        """X' [T, N, D] = post (x) y + comb^T X."""
        return mhc_expand_ref(streams, y, post, comb)

    # ---- through the bound backend op -------------------------------------------------------
    def mix(self, streams: torch.Tensor, pending: Pending | None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Apply the previous site's ``pending`` write-back (if any), then this site's
        coefficients: (X', pre, post, comb)."""
        return self.ops.mix(streams, self, pending)

    def collapse_norm(self, streams: torch.Tensor, pre: torch.Tensor, norm) -> torch.Tensor:
        """The sublayer input ``norm(sum_i pre_i X_i)``."""
        return self.ops.collapse_norm(streams, pre, norm)

    def write_back(self, streams: torch.Tensor, pending: Pending) -> torch.Tensor:
        """X' = post (x) y + comb^T X of a ``pending`` site."""
        return self.ops.expand(streams, pending)
