"""The ``torch`` backend of every hot op (see ``glmlab.model.backends`` for the signatures).

Thin adapters from the model's batch layout onto the references in ``glmlab.kernels.*.ref``:
loops over sequences where the reference is per sequence, blocks over queries where a gather
would otherwise be too large. Correct everywhere, fast nowhere. The layer-level ops
(``kda_step``, ``dsa_index``) are the layers' own per-sequence paths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glmlab.cache.storage import ModelCache
from glmlab.kernels.dsa.ref import sparse_mla_ref
from glmlab.kernels.fused.ref import (
    mhc_coefficients_ref,
    mhc_collapse_ref,
    mhc_expand_ref,
    rmsnorm_ref,
    router_ref,
)
from glmlab.kernels.kda.ref import kda_chunk_ref, kda_recurrent_ref
from glmlab.kernels.moe.ref import moe_experts_ref

_GATHER_ELEMS = 1 << 25  # rows x width x rank gathered at once by the sparse-MLA reference


def kda_prefill(q, k, v, g, beta, states, cu_seqlens):
    bounds = cu_seqlens.tolist()
    outs, finals = [], []
    for i in range(len(bounds) - 1):
        s, e = bounds[i], bounds[i + 1]
        o, st = kda_chunk_ref(
            q[None, s:e],
            k[None, s:e],
            v[None, s:e],
            g[None, s:e],
            beta[None, s:e],
            states[i : i + 1],
        )
        outs.append(o[0])
        finals.append(st)
    return torch.cat(outs), torch.cat(finals)


def kda_decode(q, k, v, g, beta, states):
    o, s = kda_recurrent_ref(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], states)
    return o[:, 0], s


def sparse_mla(
    q: torch.Tensor, cache: ModelCache, layer: int, slot_indices: torch.Tensor, scale: float
) -> torch.Tensor:
    t_len, _, r = q.shape
    w = max(1, slot_indices.shape[1])
    step = max(1, _GATHER_ELEMS // (w * r))
    out = []
    for s in range(0, t_len, step):
        idx = slot_indices[s : s + step]
        rows = cache.read_latent(layer, idx.clamp(min=0), torch.float32)  # [t, W, R]
        out.append(sparse_mla_ref(q[s : s + step], rows, idx >= 0, scale))
    return torch.cat(out) if out else q.new_zeros(0, q.shape[1], r, dtype=torch.float32)


def moe_experts(x, ids, weights, experts):
    return moe_experts_ref(
        x,
        ids,
        weights,
        experts.w13,
        experts.w2,
        experts.limit,
        experts.w13_scale,
        experts.w2_scale,
        experts.block,
    )


# ---- the reference side of the fused ops (glmlab.model.fast_ops has the kernel side) ----------

def linear_fp8(x, linear, residual=None, x_scale=None):
    """Dequantise the block-FP8 weight to x.dtype, one matmul (weight-only FP8: x not rounded)."""
    if x_scale is not None:
        raise ValueError("the torch linear_fp8 takes unquantised activations")
    y = F.linear(x, linear.dense_weight(x.dtype))
    return y if residual is None else y + residual


def rmsnorm(x, norm, residual=None):
    return rmsnorm_ref(x, norm.weight, norm.eps, residual)


class _MHC:
    """One mHC site as the reference computes it (kernels/fused/ref.py)."""

    @staticmethod
    def mix(x, hc, pending):
        if pending is not None:
            x = mhc_expand_ref(x, *pending)
        return (x, *mhc_coefficients_ref(x, hc.fn, hc.base, hc.scale, hc.iters, hc.eps,
                                         hc.norm_eps))

    @staticmethod
    def collapse_norm(x, pre, norm):
        return norm(mhc_collapse_ref(x, pre))

    @staticmethod
    def expand(x, pending):
        return mhc_expand_ref(x, *pending)


mhc = _MHC()


def router(h, r):
    return router_ref(h, r.weight, r.e_score_correction_bias, r.top_k, r.scaling, r.renormalize)


def kda_step(layer, h, plan, cache):
    return layer.reference_step(h, plan, cache)


def dsa_index(layer, h, q_lat, plan, cache):
    return layer.reference_index(h, q_lat, plan, cache)
