"""Manifold-constrained hyper-connections (mHC): N residual streams instead of one.

Each decoder layer has two mHC sites (before attention, before the FFN). A site reads the N streams
of a token, and from one projection of their (unweighted-RMS-normalised) concatenation derives

- ``pre``  [N]:   how to collapse the streams into the sublayer input u = sum_i pre_i X_i,
- ``post`` [N]:   how much of the sublayer output y each stream receives (range (0, 2)),
- ``comb`` [N,N]: a near doubly-stochastic mixing of the old streams (softmax, then Sinkhorn).

New streams: X'_k = post_k * y + sum_j comb[j, k] X_j. All coefficient maths is fp32; the final
mixing casts ``post`` and ``comb`` to the activation dtype first, as transformers does.
"""

from __future__ import annotations

import torch
from torch import nn

from glmlab.config import MHCConfig
from glmlab.model.layers import rms_normalize


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

    def coefficients(self, streams: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """streams [T, N, D] -> pre [T, N], post [T, N], comb [T, N, N] (all fp32)."""
        n = self.n
        z = rms_normalize(streams.flatten(1), self.norm_eps)  # [T, N*D]
        m = z @ self.fn.float().t()  # [T, (2+N)*N]
        m_pre, m_post, m_comb = m.split([n, n, n * n], dim=-1)
        b_pre, b_post, b_comb = self.base.float().split([n, n, n * n])
        s_pre, s_post, s_comb = self.scale.float().unbind(0)
        pre = torch.sigmoid(s_pre * m_pre + b_pre) + self.eps
        post = 2 * torch.sigmoid(s_post * m_post + b_post)
        comb = torch.softmax((s_comb * m_comb + b_comb).unflatten(-1, (n, n)), dim=-1) + self.eps
        comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        for _ in range(self.iters - 1):
            comb = comb / (comb.sum(dim=-1, keepdim=True) + self.eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        return pre, post, comb

    def collapse(self, streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        """u [T, D] = sum_i pre_i X_i (in fp32, cast to the stream dtype)."""
        return (pre[..., None] * streams).sum(dim=1).to(streams.dtype)

    def expand(
        self, streams: torch.Tensor, y: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
    ) -> torch.Tensor:
        """X' [T, N, D] = post (x) y + comb^T X."""
        dt = streams.dtype
        return post.to(dt)[..., None] * y[:, None, :] + comb.to(dt).transpose(-1, -2) @ streams
