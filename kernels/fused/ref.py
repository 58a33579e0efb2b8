"""Torch references of the fused small ops: mHC sites, RMSNorm (+ residual add), the MoE router.

These are the model's own numerics (``glmlab.model`` calls them on its torch backends, and
transformers' GLM-5.3-Flash parity is tested through them); the Triton kernels beside this file
are tested against them. Shapes (kernels/README.md): T tokens, N mHC streams, D hidden, E experts,
A active experts.

mHC (docs/model.md section 2.2), per token, all coefficient maths in fp32:
  z = rms_normalise(flatten(X));  m = fn z;  pre = sigmoid(s0 m_pre + b_pre) + eps;
  post = 2 sigmoid(s1 m_post + b_post);  C = softmax_rows(s2 M_comb + B_comb) + eps;
  C = C / (colsum C + eps);  (iters - 1) x { C = C / (rowsum C + eps); C = C / (colsum C + eps) }
  u = sum_i pre_i X_i (fp32, rounded to X's dtype);  X' = post (x) y + C^T X (in X's dtype).
"""

from __future__ import annotations

import torch

from glmlab.kernels.moe.ref import route_ref


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Unweighted RMSNorm in fp32 (the mHC input norm)."""
    xf = x.float()
    return xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """h = weight * to_dtype(s * rsqrt(mean(s^2) + eps)) with s = x (+ residual, in x.dtype).

    Returns (h, s): the normalised rows and the (summed) input, both in x.dtype; fp32 maths, the
    cast back *before* the weight multiply (transformers' GLM RMSNorm).
    """
    s = x if residual is None else x + residual
    sf = s.float()
    sf = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * sf.to(s.dtype), s


def mhc_coefficients_ref(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor,
                         scale: torch.Tensor, iters: int, eps: float, norm_eps: float
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, N, D] streams -> pre [T, N], post [T, N], comb [T, N, N] (fp32).

    fn [(2+N)N, N*D], base [(2+N)N], scale [3].
    """
    n = x.shape[1]
    z = rms_normalize(x.flatten(1), norm_eps)  # [T, N*D]
    m = z @ fn.float().t()  # [T, (2+N)*N]
    m_pre, m_post, m_comb = m.split([n, n, n * n], dim=-1)
    b_pre, b_post, b_comb = base.float().split([n, n, n * n])
    s_pre, s_post, s_comb = scale.float().unbind(0)
    pre = torch.sigmoid(s_pre * m_pre + b_pre) + eps
    post = 2 * torch.sigmoid(s_post * m_post + b_post)
    comb = torch.softmax((s_comb * m_comb + b_comb).unflatten(-1, (n, n)), dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb


def mhc_collapse_ref(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """u [T, D] = sum_i pre_i X_i (in fp32, cast to the stream dtype)."""
    return (pre[..., None] * x).sum(dim=1).to(x.dtype)


def mhc_expand_ref(x: torch.Tensor, y: torch.Tensor, post: torch.Tensor,
                   comb: torch.Tensor) -> torch.Tensor:
    """X' [T, N, D] = post (x) y + comb^T X, with post and comb cast to the stream dtype first."""
    dt = x.dtype
    return post.to(dt)[..., None] * y[:, None, :] + comb.to(dt).transpose(-1, -2) @ x


def mhc_collapse_norm_ref(x: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> torch.Tensor:
    """The sublayer input: RMSNorm_weight(sum_i pre_i X_i)."""
    return rmsnorm_ref(mhc_collapse_ref(x, pre), weight, eps)[0]


def router_ref(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int,
               scaling: float, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 logits h W^T, then ``moe.ref.route_ref``: weights [T, A] fp32, ids [T, A]."""
    logits = h.float() @ weight.float().t()
    return route_ref(logits, bias, top_k, scaling, renormalize)
