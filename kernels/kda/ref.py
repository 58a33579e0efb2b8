"""Torch references for Kimi delta attention (KDA): the spec every KDA kernel is tested against.

Shapes (kernels/README.md): B batch, T tokens, H heads, K key dim, V value dim, C channels.

The recurrence per head, with the state S in R^{K x V} kept in fp32:

    S   <- diag(exp(g_t)) S                       # per-key-channel decay, g_t <= 0
    u_t  = beta_t * (v_t - S^T k_t)               # delta rule: correct what S predicts for k_t
    S   <- S + k_t u_t^T
    o_t  = S^T q_t

``kda_recurrent_ref`` runs it step by step (the decode form). ``kda_chunk_ref`` is the chunked
(WY / UT-transform) form used for prefill; the two are tested against each other and against fla's
naive functions. Inputs are already L2-normalised and q is already scaled; both references compute
in fp32 and return fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim (eps inside the sqrt, as fla and HF do)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def kda_gate_ref(
    f: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float
) -> torch.Tensor:
    """Log-space decay with a lower bound: g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias)).

    Args:
        f: [..., H*K] forget-gate projection (any float dtype).
        a_log: [H] fp32.  dt_bias: [H*K] fp32.
    Returns:
        g: [..., H, K] fp32, in (lower_bound, 0).
    """
    h = a_log.shape[0]
    x = (f.float() + dt_bias.float()).unflatten(-1, (h, -1))
    return lower_bound * torch.sigmoid(torch.exp(a_log.float())[:, None] * x)


def causal_conv_ref(
    x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv1d over time followed by SiLU, carrying the last K-1 inputs.

    Args:
        x: [T, C] new inputs.  weight: [C, W] (W = kernel width).
        state: [C, W-1] previous inputs (oldest first), or None for a fresh sequence (zeros).
    Returns:
        y: [T, C] in x.dtype (computed in weight.dtype), and the new state [C, W-1] in x.dtype.
    """
    c, w = weight.shape
    if state is None:
        state = x.new_zeros(c, w - 1)
    xx = torch.cat([state.to(x.dtype), x.t()], dim=1)  # [C, W-1+T]
    y = F.conv1d(xx.to(weight.dtype)[None], weight[:, None, :], groups=c)[0]  # [C, T]
    return F.silu(y).t().to(x.dtype), xx[:, xx.shape[1] - (w - 1) :]


def _fp32_inputs(q, k, v, g, beta, initial_state):
    """Everything in fp32, and a zero state [B, H, K, V] when none is given."""
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    b, _, h, dk = k.shape
    s = k.new_zeros(b, h, dk, v.shape[-1]) if initial_state is None else initial_state.float()
    return q, k, v, g, beta, s


def kda_recurrent_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-by-step KDA.

    Args:
        q, k: [B, T, H, K] (normalised; q pre-scaled).  v: [B, T, H, V].
        g: [B, T, H, K] log decay.  beta: [B, T, H].  initial_state: [B, H, K, V] or None.
    Returns:
        o: [B, T, H, V] fp32 and the final state [B, H, K, V] fp32.
    """
    q, k, v, g, beta, s = _fp32_inputs(q, k, v, g, beta, initial_state)
    b, t_len, h, _ = k.shape
    out = []
    for t in range(t_len):
        s = s * g[:, t].exp()[..., None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", s, k[:, t]))
        s = s + k[:, t, :, :, None] * u[:, :, None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", s, q[:, t]))
    return torch.stack(out, dim=1), s


def kda_chunk_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked KDA: same arguments and results as ``kda_recurrent_ref``.

    Inside a chunk, with G_t the cumulative log decay since the chunk start (per key channel),
    the corrected values U solve the unit-lower-triangular system

        (I + diag(beta) A) U = diag(beta) (V - (exp(G) * K) S0)
        A_ts = sum_c k_t[c] k_s[c] e^{G_t[c] - G_s[c]}  for s < t

    after which o_t = (exp(G_t) * q_t) S0 + sum_{s<=t} (q_t . k_s e^{G_t - G_s}) u_s and
    S_end = exp(G_C) * S0 + sum_s (k_s e^{G_C - G_s}) u_s^T. Differences of G are formed before the
    exponential, so no term can overflow however strong the decay.
    """
    q, k, v, g, beta, s = _fp32_inputs(q, k, v, g, beta, initial_state)
    b, t_len, h, _ = k.shape
    outs = []
    for start in range(0, t_len, chunk_size):
        sl = slice(start, min(start + chunk_size, t_len))
        o, s = _chunk_step(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], s)
        outs.append(o)
    if not outs:
        return v.new_zeros(b, 0, h, v.shape[-1]), s
    return torch.cat(outs, dim=1), s


def _chunk_step(q, k, v, g, beta, s0):
    # Move heads first: [B, H, C, *].
    q, k, v, g = (t.transpose(1, 2) for t in (q, k, v, g))
    beta = beta.transpose(1, 2)
    c = k.shape[2]
    cum = g.cumsum(dim=2)  # [B, H, C, K]
    diff = cum[:, :, :, None, :] - cum[:, :, None, :, :]  # [B, H, t, s, K]: G_t - G_s
    causal = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
    decay = diff.masked_fill(~causal[..., None], float("-inf")).exp()  # 0 above the diagonal
    kk = torch.einsum("bhtk,bhsk,bhtsk->bhts", k, k, decay).tril(-1)  # A, strictly lower
    eye = torch.eye(c, device=k.device)
    lhs = eye + beta[..., None] * kk
    rhs = beta[..., None] * (v - torch.einsum("bhtk,bhkv->bhtv", cum.exp() * k, s0))
    u = torch.linalg.solve_triangular(lhs, rhs, upper=False, unitriangular=True)
    qk = torch.einsum("bhtk,bhsk,bhtsk->bhts", q, k, decay)  # includes s == t
    o = torch.einsum("bhtk,bhkv->bhtv", cum.exp() * q, s0) + qk @ u
    tail = (cum[:, :, -1:, :] - cum).exp() * k  # [B, H, C, K]: k_s e^{G_C - G_s}
    s_end = cum[:, :, -1, :].exp()[..., None] * s0 + torch.einsum("bhsk,bhsv->bhkv", tail, u)
    return o.transpose(1, 2), s_end
