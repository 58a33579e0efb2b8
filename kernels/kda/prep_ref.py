"""Torch reference of the fused KDA input prep of a uniform step (N sequences x n new tokens each).

What the KDA layer computes between its projections and the delta rule (docs/model.md section 2.4),
batched over sequences whose short-conv state lives in the cache at ``slots``:

  window = [held W-1 inputs | n new inputs]            per channel of [q | k | v]
  y_t    = silu(sum_i w[c, i] window[t + i])           fp32, rounded to the activation dtype
  q, k   = l2norm(y_q), l2norm(y_k) per head (q * K^-0.5), fp32;  v = y_v
  g      = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias))   fp32
  beta   = sigmoid(b)                                  in the activation dtype
  conv[slots] <- the last W-1 inputs of the window

Tokens are sequence-major (token i*n + t is step t of sequence i), as a decode (n = 1) or verify
(n = D) batch lays them out. Numerics are exactly the layer's torch path (``_conv_decode`` /
``causal_conv_ref``, ``l2norm``, ``kda_gate_ref``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glmlab.kernels.kda.ref import kda_gate_ref, l2norm


def kda_prep_ref(qkv: torch.Tensor, conv: torch.Tensor, slots: torch.Tensor,
                 conv_weight: torch.Tensor, f: torch.Tensor, a_log: torch.Tensor,
                 dt_bias: torch.Tensor, lower_bound: float, b: torch.Tensor, num_heads: int
                 ) -> tuple[torch.Tensor, ...]:
    """Returns q, k, g [T, H, K] fp32, v [T, H, V] and beta [T, H] in qkv.dtype; updates ``conv``.

    Args:
        qkv: [T, 3P] projections (P = H*K).  conv: [S, 3P, W-1] the cache's conv state.
        slots: [N] state slots (T = N * n).  conv_weight: [3P, W] fp32.
        f: [T, P] forget-gate projection.  a_log: [H] fp32.  dt_bias: [P] fp32.  b: [T, H].
    """
    n_seq = slots.shape[0]
    t_len, channels = qkv.shape
    n = t_len // n_seq
    w = conv_weight.shape[1]
    held = conv[slots].to(qkv.dtype)  # [N, 3P, W-1]
    new = qkv.view(n_seq, n, channels).transpose(1, 2)
    window = torch.cat([held, new], dim=2)  # [N, 3P, W-1+n]
    y = F.conv1d(window.float().reshape(1, n_seq * channels, -1),
                 conv_weight.float().repeat(n_seq, 1)[:, None, :], groups=n_seq * channels)
    y = F.silu(y.view(n_seq, channels, n)).transpose(1, 2).reshape(t_len, channels).to(qkv.dtype)
    conv[slots] = window[:, :, window.shape[2] - (w - 1):].to(conv.dtype)
    q, k, v = (part.unflatten(-1, (num_heads, -1)) for part in y.chunk(3, dim=-1))
    head_dim = q.shape[-1]
    q, k = l2norm(q.float()) * head_dim**-0.5, l2norm(k.float())
    g = kda_gate_ref(f, a_log, dt_bias, lower_bound)
    return q, k, v, g, torch.sigmoid(b)
