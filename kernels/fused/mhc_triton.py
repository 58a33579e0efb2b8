"""mHC sites in Triton: stream mixing + coefficients (with all Sinkhorn iterations) in one kernel,
then the collapse + the sublayer's RMSNorm in a second.

``mhc_mix_coefficients`` reads the N streams of each token, optionally applies the *previous*
site's write-back first (X' = post (x) y + C^T X, stored), and computes this site's ``pre``,
``post`` and ``comb`` of X' (``ref.mhc_coefficients_ref``): the 24-wide projection of the
RMS-normalised streams, the sigmoids, the row softmax and all Sinkhorn iterations, in fp32. The
N*D reduction is split over channel ranges so that a decode step's few tokens still fill the GPU;
the program that draws the last ticket (``tickets.py``) sums the partials in split order and runs
the coefficient maths. So the write-back of one site and the coefficients of the next are one
launch, and nothing leaves the GPU.

``mhc_collapse_norm`` is u = sum_i pre_i X_i (fp32, rounded to the stream dtype) and the sublayer
input RMSNorm_w(u), one program per token.

Roundings repeat the torch path's: post and comb are cast to the stream dtype before the mixing,
the two mixing terms are rounded separately and then summed (``ref.mhc_expand_ref``). The
projection runs as a dot of the stored (rounded) streams with ``fn``: exact products for bf16,
IEEE fp32 for fp32 operands. Knows nothing about which sublayer follows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from glmlab.kernels.fp8 import interpret_casts
from glmlab.kernels.fused.tickets import ticket_counters


@triton.jit
def _sigmoid(x, PRECISE: tl.constexpr):
    if PRECISE:  # torch's CUDA sigmoid: 1 / (1 + expf(-x)), IEEE division
        return tl.math.div_rn(tl.full(x.shape, 1.0, tl.float32), 1.0 + libdevice.exp(-x))
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _mix_kernel(x_ptr, y_ptr, post_ptr, comb_ptr, xo_ptr, fn_ptr, base_ptr, scale_ptr,
                pre_o, post_o, comb_o, ws_m, ws_s, ticket_ptr,
                T, D, stride_fn, eps, norm_eps, iters,
                N: tl.constexpr, P: tl.constexpr, P_PAD: tl.constexpr, HAS_MIX: tl.constexpr,
                HAS_COEF: tl.constexpr, SPLITS: tl.constexpr, CHUNKS: tl.constexpr,
                DOT_FP32: tl.constexpr, PRECISE: tl.constexpr, BT: tl.constexpr,
                BD: tl.constexpr):
    tb = tl.program_id(0)
    sp = tl.program_id(1)
    rows = tb * BT + tl.arange(0, BT)
    r_ok = rows < T
    r64 = rows.to(tl.int64)
    ps = tl.arange(0, P_PAD)
    m = tl.zeros([BT, P_PAD], dtype=tl.float32)
    ss = tl.zeros([BT], dtype=tl.float32)
    for c in range(CHUNKS):
        d = (sp * CHUNKS + c) * BD + tl.arange(0, BD)
        d_ok = d < D
        ok = r_ok[:, None] & d_ok[None, :]
        if HAS_MIX:
            y = tl.load(y_ptr + r64[:, None] * D + d[None, :], mask=ok, other=0.0)
        for i in tl.static_range(N):
            at = x_ptr + r64[:, None] * (N * D) + i * D + d[None, :]
            if HAS_MIX:
                act = y.dtype
                p_i = tl.load(post_ptr + rows * N + i, mask=r_ok, other=0.0).to(act)
                lead = (p_i[:, None].to(tl.float32) * y.to(tl.float32)).to(act)
                mix = tl.zeros([BT, BD], dtype=tl.float32)
                for j in tl.static_range(N):
                    c_ji = tl.load(comb_ptr + rows * (N * N) + j * N + i, mask=r_ok, other=0.0)
                    xj = tl.load(x_ptr + r64[:, None] * (N * D) + j * D + d[None, :], mask=ok,
                                 other=0.0)
                    mix += c_ji.to(act).to(tl.float32)[:, None] * xj.to(tl.float32)
                xi = (lead.to(tl.float32) + mix.to(act).to(tl.float32)).to(act)
                tl.store(xo_ptr + r64[:, None] * (N * D) + i * D + d[None, :], xi, mask=ok)
            else:
                xi = tl.load(at, mask=ok, other=0.0)
            if HAS_COEF:
                xf = xi.to(tl.float32)
                ss += tl.sum(xf * xf, axis=1)
                fnt = tl.load(fn_ptr + ps[None, :] * stride_fn + i * D + d[:, None],
                              mask=(ps[None, :] < P) & d_ok[:, None], other=0.0)  # [BD, P_PAD]
                if DOT_FP32:
                    m += tl.dot(xf, fnt.to(tl.float32), input_precision="ieee")
                else:
                    m += tl.dot(xi.to(fnt.dtype), fnt)
    if HAS_COEF:
        at_m = ws_m + (sp * T + r64)[:, None] * P_PAD + ps[None, :]
        if SPLITS > 1:
            tl.store(at_m, m, mask=r_ok[:, None])
            tl.store(ws_s + sp * T + rows, ss, mask=r_ok)
            tl.debug_barrier()
            if tl.atomic_add(ticket_ptr + tb, 1, sem="acq_rel") != SPLITS - 1:
                return
            m = tl.zeros([BT, P_PAD], dtype=tl.float32)
            ss = tl.zeros([BT], dtype=tl.float32)
            for s in range(SPLITS):
                m += tl.load(ws_m + (s * T + r64)[:, None] * P_PAD + ps[None, :],
                             mask=r_ok[:, None], other=0.0, cache_modifier=".cg")
                ss += tl.load(ws_s + s * T + rows, mask=r_ok, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(ticket_ptr + tb, 0)
        z = m * (1.0 / tl.sqrt(ss / (N * D) + norm_eps))[:, None]
        # Re-read the 24 logits in their [N] / [N, N] shapes through split 0's workspace rows.
        z_at = ws_m + r64[:, None] * P_PAD + ps[None, :]
        tl.debug_barrier()
        tl.store(z_at, z, mask=r_ok[:, None])
        tl.debug_barrier()
        s_pre = tl.load(scale_ptr)
        s_post = tl.load(scale_ptr + 1)
        s_comb = tl.load(scale_ptr + 2)
        ns = tl.arange(0, N)
        zr = ws_m + r64[:, None] * P_PAD
        pre = _sigmoid(s_pre * tl.load(zr + ns[None, :], mask=r_ok[:, None], other=0.0)
                       + tl.load(base_ptr + ns)[None, :], PRECISE) + eps
        post = 2.0 * _sigmoid(s_post * tl.load(zr + N + ns[None, :], mask=r_ok[:, None],
                                               other=0.0)
                              + tl.load(base_ptr + N + ns)[None, :], PRECISE)
        cc = ns[:, None] * N + ns[None, :]  # [N, N] row-major (a, b)
        logit = s_comb * tl.load(ws_m + r64[:, None, None] * P_PAD + 2 * N + cc[None, :, :],
                                 mask=r_ok[:, None, None], other=0.0) \
            + tl.load(base_ptr + 2 * N + cc)[None, :, :]
        e = logit - tl.max(logit, axis=2)[:, :, None]
        if PRECISE:
            e = libdevice.exp(e)
        else:
            e = tl.exp(e)
        comb = e / tl.sum(e, axis=2)[:, :, None] + eps
        comb = comb / (tl.sum(comb, axis=1)[:, None, :] + eps)
        for _ in range(iters - 1):
            comb = comb / (tl.sum(comb, axis=2)[:, :, None] + eps)
            comb = comb / (tl.sum(comb, axis=1)[:, None, :] + eps)
        tl.store(pre_o + rows[:, None] * N + ns[None, :], pre, mask=r_ok[:, None])
        tl.store(post_o + rows[:, None] * N + ns[None, :], post, mask=r_ok[:, None])
        tl.store(comb_o + rows[:, None, None] * (N * N) + cc[None, :, :], comb,
                 mask=r_ok[:, None, None])


@triton.jit
def _collapse_norm_kernel(x_ptr, pre_ptr, w_ptr, h_ptr, D, eps, N: tl.constexpr,
                          BD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BD)
    ok = d < D
    u = tl.zeros([BD], dtype=tl.float32)
    for i in tl.static_range(N):
        xi = tl.load(x_ptr + t * (N * D) + i * D + d, mask=ok, other=0.0)
        u += tl.load(pre_ptr + t * N + i) * xi.to(tl.float32)
    act = xi.dtype
    u = u.to(act).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(u * u, axis=0) / D + eps)
    w = tl.load(w_ptr + d, mask=ok, other=0.0)
    h = (w.to(tl.float32) * (u * r).to(act).to(tl.float32)).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + t * D + d, h, mask=ok)


_BT, _BD = 16, 128


def _splits(t: int, d: int, num_sms: int = 132) -> int:
    """Channel splits: enough programs for two per SM, at least one 128-channel chunk each."""
    chunks, t_blocks, s = triton.cdiv(d, _BD), triton.cdiv(t, _BT), 1
    while t_blocks * s < 2 * num_sms and s * 2 <= chunks:
        s *= 2
    return s


def mhc_mix_coefficients(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor,
                         scale: torch.Tensor, iters: int, eps: float, norm_eps: float,
                         pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                         coefficients: bool = True):
    """One mHC site's coefficients, after the previous site's write-back if ``pending``.

    Args:
        x: [T, N, D] streams (contiguous).  fn [(2+N)N, N*D], base [(2+N)N] fp32, scale [3] fp32.
        pending: (y [T, D], post [T, N] fp32, comb [T, N, N] fp32) of the previous site, applied
            first: X' = post (x) y + comb^T X.
        coefficients: False only applies ``pending`` (the model's last site).
    Returns:
        (X' [T, N, D] (x itself without ``pending``), pre [T, N], post [T, N], comb [T, N, N]),
        coefficients fp32 (None when ``coefficients`` is False).
    """
    t, n, d = x.shape
    if not x.is_cuda:
        interpret_casts.install()
    x = x.contiguous()
    dev, f32 = x.device, torch.float32
    xo = torch.empty_like(x) if pending is not None else x
    y, post, comb = pending if pending is not None else (x, x, x)
    if pending is not None and (y.shape != (t, d) or post.shape != (t, n)
                                or comb.shape != (t, n, n)):
        raise ValueError(f"pending site has y {tuple(y.shape)}, post {tuple(post.shape)}, comb "
                         f"{tuple(comb.shape)} for streams {tuple(x.shape)}")
    p = (2 + n) * n
    p_pad = triton.next_power_of_2(p)
    if coefficients and (fn.shape != (p, n * d) or n & (n - 1)):
        raise ValueError(f"fn must be [{p}, {n * d}] and N a power of two; got {tuple(fn.shape)}")
    splits = _splits(t, d) if coefficients else triton.cdiv(triton.cdiv(d, _BD), 4)
    chunks = triton.cdiv(triton.cdiv(d, _BD), splits)
    splits = triton.cdiv(triton.cdiv(d, _BD), chunks)
    t_blocks = triton.cdiv(t, _BT)
    pre_o, post_o = torch.empty(t, n, dtype=f32, device=dev), torch.empty(t, n, dtype=f32,
                                                                           device=dev)
    comb_o = torch.empty(t, n, n, dtype=f32, device=dev)
    ws_m = torch.empty(splits, t, p_pad, dtype=f32, device=dev)
    ws_s = torch.empty(splits, t, dtype=f32, device=dev)
    tickets = ticket_counters(dev, t_blocks) if splits > 1 and coefficients else ws_s
    if t:
        fn_, base_, scale_ = (fn, base, scale) if coefficients else (x, ws_s, ws_s)
        _mix_kernel[(t_blocks, splits)](
            x, y.contiguous(), post.contiguous(), comb.contiguous(), xo, fn_, base_, scale_,
            pre_o, post_o, comb_o, ws_m, ws_s, tickets, t, d, fn_.stride(0), float(eps),
            float(norm_eps), int(iters), N=n, P=p, P_PAD=p_pad, HAS_MIX=pending is not None,
            HAS_COEF=coefficients, SPLITS=splits, CHUNKS=chunks,
            DOT_FP32=x.dtype == torch.float32 or fn_.dtype == torch.float32,
            PRECISE=x.is_cuda, BT=_BT, BD=_BD, num_warps=4, num_stages=1)
    if not coefficients:
        return xo, None, None, None
    return xo, pre_o, post_o, comb_o


def mhc_collapse_norm(x: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> torch.Tensor:
    """h [T, D] = RMSNorm_weight(sum_i pre_i X_i) in x.dtype (``ref.mhc_collapse_norm_ref``)."""
    t, n, d = x.shape
    h = torch.empty(t, d, dtype=x.dtype, device=x.device)
    if t:
        bd = triton.next_power_of_2(d)
        _collapse_norm_kernel[(t,)](x.contiguous(), pre.contiguous(), weight, h, d, float(eps),
                                    N=n, BD=bd, num_warps=4 if bd <= 2048 else 8)
    return h
