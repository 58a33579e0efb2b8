"""Fused KDA input prep in Triton: short conv with carried state, SiLU, L2 norm, gate, beta.

``kda_prep`` is ``prep_ref.kda_prep_ref`` in one launch for a uniform step (N sequences x n new
tokens: decode n = 1, speculative verify n = D). One program per (sequence, head) walks the
sequence's n tokens in order, holding the W-1 carried conv inputs of the head's q, k and v
channels in registers, so the state is read once and written once, in place at the sequence's
slot. Per token it writes l2-normalised q (scaled by K^-0.5) and k and the gate g in fp32, v and
beta in the activation dtype: what the delta rule (``kernels/decode``) reads.

Roundings are the layer's torch path's: the conv output is rounded to the activation dtype
before the L2 norm; beta = sigmoid of the activation-dtype projection, rounded back. The conv width
is 4 (GLM-5.3-Flash's ``short_conv_kernel_size``); other widths are refused. Knows nothing about
the projections before it or the recurrence after it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from glmlab.kernels.fused.mhc_triton import _sigmoid

CONV_WIDTH = 4


@triton.jit
def _silu(y, PRECISE: tl.constexpr):
    if PRECISE:  # torch's CUDA silu: x / (1 + expf(-x)), IEEE division
        return tl.math.div_rn(y, 1.0 + libdevice.exp(-y))
    return y / (1.0 + tl.exp(-y))


@triton.jit
def _prep_kernel(qkv_ptr, conv_ptr, slots_ptr, cw_ptr, f_ptr, alog_ptr, dtb_ptr, b_ptr,
                 q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, n, P, H, lower_bound,
                 stride_qkv, stride_cs, stride_cc, stride_f, stride_b,
                 K: tl.constexpr, PRECISE: tl.constexpr):
    seq, head = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    c = tl.arange(0, K)
    # channel rows of this head in [q | k | v], stacked as [3, K] -> three [K] groups
    cq, ck, cv = head * K + c, P + head * K + c, 2 * P + head * K + c
    st = conv_ptr + slot * stride_cs
    act = qkv_ptr.dtype.element_ty
    # held inputs, oldest first (columns 0, 1, 2 of the [3P, W-1] state), in the activation dtype
    q0 = tl.load(st + cq * stride_cc + 0).to(act).to(tl.float32)
    q1 = tl.load(st + cq * stride_cc + 1).to(act).to(tl.float32)
    q2 = tl.load(st + cq * stride_cc + 2).to(act).to(tl.float32)
    k0 = tl.load(st + ck * stride_cc + 0).to(act).to(tl.float32)
    k1 = tl.load(st + ck * stride_cc + 1).to(act).to(tl.float32)
    k2 = tl.load(st + ck * stride_cc + 2).to(act).to(tl.float32)
    v0 = tl.load(st + cv * stride_cc + 0).to(act).to(tl.float32)
    v1 = tl.load(st + cv * stride_cc + 1).to(act).to(tl.float32)
    v2 = tl.load(st + cv * stride_cc + 2).to(act).to(tl.float32)
    wq0, wq1 = tl.load(cw_ptr + cq * 4 + 0), tl.load(cw_ptr + cq * 4 + 1)
    wq2, wq3 = tl.load(cw_ptr + cq * 4 + 2), tl.load(cw_ptr + cq * 4 + 3)
    wk0, wk1 = tl.load(cw_ptr + ck * 4 + 0), tl.load(cw_ptr + ck * 4 + 1)
    wk2, wk3 = tl.load(cw_ptr + ck * 4 + 2), tl.load(cw_ptr + ck * 4 + 3)
    wv0, wv1 = tl.load(cw_ptr + cv * 4 + 0), tl.load(cw_ptr + cv * 4 + 1)
    wv2, wv3 = tl.load(cw_ptr + cv * 4 + 2), tl.load(cw_ptr + cv * 4 + 3)
    a = libdevice.exp(tl.load(alog_ptr + head)) if PRECISE else tl.exp(tl.load(alog_ptr + head))
    dtb = tl.load(dtb_ptr + head * K + c)
    for t in range(n):
        tok = (seq * n + t).to(tl.int64)
        row = qkv_ptr + tok * stride_qkv
        xq = tl.load(row + cq).to(tl.float32)
        xk = tl.load(row + ck).to(tl.float32)
        xv = tl.load(row + cv).to(tl.float32)
        yq = wq0 * q0 + wq1 * q1 + wq2 * q2 + wq3 * xq
        yk = wk0 * k0 + wk1 * k1 + wk2 * k2 + wk3 * xk
        yv = wv0 * v0 + wv1 * v1 + wv2 * v2 + wv3 * xv
        yq = _silu(yq, PRECISE).to(act).to(tl.float32)  # rounded before the L2 norm
        yk = _silu(yk, PRECISE).to(act).to(tl.float32)
        yv = _silu(yv, PRECISE).to(act)
        yq = yq / tl.sqrt(tl.sum(yq * yq, axis=0) + 1e-6) * (K ** -0.5)
        yk = yk / tl.sqrt(tl.sum(yk * yk, axis=0) + 1e-6)
        out = (tok * H + head) * K + c
        tl.store(q_ptr + out, yq)
        tl.store(k_ptr + out, yk)
        tl.store(v_ptr + out, yv)
        fx = tl.load(f_ptr + tok * stride_f + head * K + c).to(tl.float32) + dtb
        tl.store(g_ptr + out, lower_bound * _sigmoid(a * fx, PRECISE))
        braw = tl.load(b_ptr + tok * stride_b + head)
        tl.store(beta_ptr + tok * H + head, _sigmoid(braw.to(tl.float32), PRECISE).to(act))
        q0, q1, q2 = q1, q2, xq
        k0, k1, k2 = k1, k2, xk
        v0, v1, v2 = v1, v2, xv
    cd = conv_ptr.dtype.element_ty
    tl.store(st + cq * stride_cc + 0, q0.to(cd))
    tl.store(st + cq * stride_cc + 1, q1.to(cd))
    tl.store(st + cq * stride_cc + 2, q2.to(cd))
    tl.store(st + ck * stride_cc + 0, k0.to(cd))
    tl.store(st + ck * stride_cc + 1, k1.to(cd))
    tl.store(st + ck * stride_cc + 2, k2.to(cd))
    tl.store(st + cv * stride_cc + 0, v0.to(cd))
    tl.store(st + cv * stride_cc + 1, v1.to(cd))
    tl.store(st + cv * stride_cc + 2, v2.to(cd))


def kda_prep(qkv: torch.Tensor, conv: torch.Tensor, slots: torch.Tensor,
             conv_weight: torch.Tensor, f: torch.Tensor, a_log: torch.Tensor,
             dt_bias: torch.Tensor, lower_bound: float, b: torch.Tensor, num_heads: int
             ) -> tuple[torch.Tensor, ...]:
    """``prep_ref.kda_prep_ref`` in one launch (same arguments and results; ``conv`` updated).

    Rows of ``qkv``, ``f`` and ``b`` may be strided (column slices of a fused projection).
    """
    n_seq = slots.shape[0]
    t_len, channels = qkv.shape
    p = channels // 3
    head_dim = p // num_heads
    if conv_weight.shape != (channels, CONV_WIDTH) or conv.shape[1:] != (channels,
                                                                         CONV_WIDTH - 1):
        raise ValueError(f"kda_prep handles conv width {CONV_WIDTH} only; got weight "
                         f"{tuple(conv_weight.shape)}, state {tuple(conv.shape)}")
    if n_seq == 0 or t_len % n_seq or head_dim & (head_dim - 1):
        raise ValueError(f"{t_len} tokens over {n_seq} sequences: not a uniform step, or head "
                         f"dim {head_dim} is not a power of two")
    if f.shape != (t_len, p) or b.shape != (t_len, num_heads):
        raise ValueError(f"f {tuple(f.shape)} / b {tuple(b.shape)} do not fit {t_len} tokens")
    for name, t in (("qkv", qkv), ("f", f), ("b", b), ("conv", conv)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} needs a contiguous last dim")
    dev, f32 = qkv.device, torch.float32
    q = torch.empty(t_len, num_heads, head_dim, dtype=f32, device=dev)
    k, g = torch.empty_like(q), torch.empty_like(q)
    v = torch.empty(t_len, num_heads, head_dim, dtype=qkv.dtype, device=dev)
    beta = torch.empty(t_len, num_heads, dtype=qkv.dtype, device=dev)
    _prep_kernel[(n_seq, num_heads)](
        qkv, conv, slots, conv_weight.float().contiguous(), f, a_log.float().contiguous(),
        dt_bias.float().contiguous(), b, q, k, v, g, beta, t_len // n_seq, p, num_heads,
        float(lower_bound), qkv.stride(0), conv.stride(0), conv.stride(1), f.stride(0),
        b.stride(0), K=head_dim, PRECISE=qkv.is_cuda, num_warps=1 if head_dim <= 64 else 2)
    return q, k, v, g, beta
