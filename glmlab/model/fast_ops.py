"""The ``triton`` backend of the fused ops (signatures in ``glmlab.model.backends``).

Thin adapters from the model's modules onto the kernels: the block-FP8 GEMM
(``kernels/fp8/gemm_triton.py``), RMSNorm, the mHC sites and the router (``kernels/fused``), and
the uniform-step KDA and DSA paths (``glmlab.model.kda_fast``, ``glmlab.model.dsa_fast``). Each is
tested against its torch twin in ``glmlab.model.torch_ops``. Importing this module imports Triton.
"""

from __future__ import annotations

import torch

from glmlab.kernels.fp8.gemm_triton import linear_fp8 as _linear_fp8
from glmlab.kernels.fused.mhc_triton import mhc_collapse_norm, mhc_mix_coefficients
from glmlab.kernels.fused.norm_triton import rmsnorm as _rmsnorm
from glmlab.kernels.fused.router_triton import route
from glmlab.model.dsa_fast import dsa_index
from glmlab.model.kda_fast import kda_step

__all__ = ["dsa_index", "kda_step", "linear_fp8", "mhc", "rmsnorm", "router"]


def linear_fp8(x: torch.Tensor, linear, residual=None, x_scale=None) -> torch.Tensor:
    lead, n = x.shape[:-1], linear.out_features
    r = None if residual is None else residual.reshape(-1, n)
    y = _linear_fp8(x.reshape(-1, x.shape[-1]), linear.weight, linear.weight_scale_inv,
                    tuple(linear.block), x_scale=x_scale, residual=r)
    return y.view(*lead, n)


def rmsnorm(x: torch.Tensor, norm, residual=None):
    if x.dim() == 2 and x.stride(-1) == 1:  # rows may be strided (a slice of a fused output)
        return _rmsnorm(x, norm.weight, norm.eps, residual)
    shape = x.shape
    h, s = _rmsnorm(x.reshape(-1, shape[-1]), norm.weight, norm.eps,
                    None if residual is None else residual.reshape(-1, shape[-1]))
    return h.view(shape), s.view(shape)


class _MHC:
    @staticmethod
    def mix(x, hc, pending):
        return mhc_mix_coefficients(x, hc.fn, hc.base, hc.scale, hc.iters, hc.eps, hc.norm_eps,
                                    pending)

    @staticmethod
    def collapse_norm(x, pre, norm):
        return mhc_collapse_norm(x, pre, norm.weight, norm.eps)

    @staticmethod
    def expand(x, pending):
        return mhc_mix_coefficients(x, None, None, None, 0, 0.0, 0.0, pending,
                                    coefficients=False)[0]


mhc = _MHC()


def router(h: torch.Tensor, r):
    return route(h, r.weight, r.e_score_correction_bias, r.top_k, r.scaling, r.renormalize)
