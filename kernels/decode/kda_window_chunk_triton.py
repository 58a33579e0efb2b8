"""KDA delta rule over a verify window in matrix (chunk) form on tensor cores: the same step as
``kda_window_triton._window_kernel`` (``ref.kda_window_ref``) for 1 <= n <= 16 tokens per sequence.

Why: the recurrent kernel walks the n steps one after the other on CUDA cores, each step a pass
over the [K, BV] state slice; at a verify step (132 sequences x 8 tokens, 64 heads of 128 x 128)
that is several times the time the state bytes take to read. Here the window is one chunk
(``kda.ref.kda_chunk_ref``), so the state is touched by three dots only.

Per (sequence, head), window padded to 16 rows (zero q, k, v, beta and g = 0: pad rows change
nothing), G_t = sum_{i<=t} g_i per key channel, c = G_n / 2 (centring keeps every exponent
within +-5n/2 = 40 for n <= 16, far from fp32 overflow and from subnormals):

    A[t, s]  = sum_c k_t k_s e^{G_t - G_s} = (k e^{G-c}) . (k e^{c-G})    # [16, 16]
    L        = diag(beta) A, strictly lower; (I + L)^-1 by forward substitution on [16, 16]
    U        = (I + L)^-1 diag(beta) (V - (k e^G) S0)                     # [16, BV]
    O        = (q e^G) S0 + tril_incl((q e^{G-c}) . (k e^{c-G})) U       # [16, BV]
    S_n      = e^{G_n} S0 + (k e^{G_n - G})^T U                           # only with store_state

L is nilpotent, so (I - L)(I + L^2)(I + L^4)(I + L^8) is also the exact inverse in four dots,
but its terms grow like |L|^8 while the inverse stays small: with weak decay and similar keys
(beta ~ 1) fp32 lost 5e-5 absolute that way, against 1e-6 for the substitution, whose n - 1 steps
touch a 16 x 16 tile only (the state work is the three dots). Shapes and the slot / output
conventions are those of ``kda_window`` (which validates the arguments, picks the method and,
when a program holds fewer than all V columns, runs ``_gate_norm_kernel`` after this one). fp32
dots run as "tf32x3" on the GPU (three tf32 products: near-fp32 accuracy on tensor cores) unless
told otherwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmlab.kernels.fused.mhc_triton import _sigmoid

ROWS = 16  # the window padded to the smallest tl.dot tile; also the largest n this form takes


@triton.jit
def _chunk_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, slots_ptr, gate_ptr,
                  nw_ptr, out_ptr, n, H, eps, stride_ss, stride_gate, stride_out,
                  K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, R: tl.constexpr,
                  STORE_STATE: tl.constexpr, PRECISE: tl.constexpr, DOT: tl.constexpr):
    # Value columns never mix in the delta rule, so a program takes a [K, BV] slice of the
    # state; A, L and its inverse depend on K-side data only and are recomputed per slice.
    seq, head, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    rt, rk, cv = tl.arange(0, R), tl.arange(0, K), vb * BV + tl.arange(0, BV)
    live = rt < n
    tok = (seq * n + rt).to(tl.int64)  # [R]; rows >= n are padding, never loaded or stored
    at_k = (tok[:, None] * H + head) * K + rk[None, :]  # [R, K]
    kk = tl.load(k_ptr + at_k, mask=live[:, None], other=0.0).to(tl.float32)
    qq = tl.load(q_ptr + at_k, mask=live[:, None], other=0.0).to(tl.float32)
    gg = tl.load(g_ptr + at_k, mask=live[:, None], other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + tok * H + head, mask=live, other=0.0).to(tl.float32)
    vv = tl.load(v_ptr + (tok[:, None] * H + head) * V + cv[None, :], mask=live[:, None],
                 other=0.0).to(tl.float32)  # [R, BV]
    st = state_ptr + slot * stride_ss + head * K * V + rk[:, None] * V + cv[None, :]
    s0 = tl.load(st).to(tl.float32)  # [K, BV]

    cum = tl.cumsum(gg, axis=0)  # [R, K] G_t; pad rows repeat G_n
    total = tl.sum(gg, axis=0)  # [K] G_n
    half = 0.5 * total
    up = tl.exp(cum - half[None, :])  # [R, K] e^{G_t - c}
    ki = kk * tl.exp(half[None, :] - cum)
    a = tl.dot(kk * up, tl.trans(ki), input_precision=DOT)  # [R, R]
    lower = rt[:, None] > rt[None, :]
    lo = tl.where(lower, beta[:, None] * a, 0.0)
    # (I + L)^-1 by forward substitution, row t = e_t - sum_{s<t} L[t, s] row s: n - 1 small
    # steps on a [R, R] tile (not the state), as accurate as a triangular solve.
    inv = tl.where(rt[:, None] == rt[None, :], 1.0, 0.0)
    for t in range(1, n):
        at_t = rt[:, None] == t
        l_t = tl.sum(tl.where(at_t, lo, 0.0), axis=0)  # [R] L[t, :]
        inv = tl.where(at_t, inv - tl.sum(l_t[:, None] * inv, axis=0)[None, :], inv)

    decay = tl.exp(cum)  # [R, K] e^{G_t} <= 1
    rhs = beta[:, None] * (vv - tl.dot(kk * decay, s0, input_precision=DOT))
    u = tl.dot(inv, rhs, input_precision=DOT)  # [R, BV]; zero on pad rows (beta = 0)
    qk = tl.dot(qq * up, tl.trans(ki), input_precision=DOT)
    qk = tl.where(rt[:, None] >= rt[None, :], qk, 0.0)
    o = tl.dot(qq * decay, s0, input_precision=DOT) + tl.dot(qk, u, input_precision=DOT)

    act = out_ptr.dtype.element_ty
    at_o = out_ptr + tok[:, None] * stride_out + head * V + cv[None, :]
    if BV == V:  # the whole head here: fuse the gated head norm
        gate = tl.load(gate_ptr + tok[:, None] * stride_gate + head * V + cv[None, :],
                       mask=live[:, None], other=0.0).to(tl.float32)
        of = o.to(act).to(tl.float32)
        of = of * (1.0 / tl.sqrt(tl.sum(of * of, axis=1) / V + eps))[:, None]
        y = tl.load(nw_ptr + cv).to(tl.float32)[None, :] * of * _sigmoid(gate, PRECISE)
        tl.store(at_o, y.to(act), mask=live[:, None])
    else:
        tl.store(at_o, o.to(act), mask=live[:, None])
    if STORE_STATE:
        tail = kk * tl.exp(total[None, :] - cum)  # [R, K] k_s e^{G_n - G_s}, zero on pad rows
        s = s0 * tl.exp(total)[:, None] + tl.dot(tl.trans(tail), u, input_precision=DOT)
        tl.store(st, s.to(state_ptr.dtype.element_ty))


def chunk_value_block(dk: int, dv: int) -> int:
    """State columns per program. Registers: at K = V = 128 a program holds the [128, BV] fp32
    state (and with store_state the updated one) beside about six [16, 128] fp32 K-side tiles;
    BV = 64 over 8 warps keeps that near 32 + 6 * 8 values a thread (BV = 128 doubles the state
    part and risks spills; BV = 32 recomputes the K-side work, A, L^-1 and Q K^T, four times per
    head). Reasoned, not yet measured: ``--op kda-window --chunk-block-v 32,64,128`` compares.
    Narrower heads take all V columns, and the norm stays fused."""
    if dk * dv <= 64 * 64:
        return dv
    return min(dv, 64)


def chunk_num_warps(dk: int, bv: int) -> int:
    return 8 if dk * bv >= 8192 else 4


def launch_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, recurrent: torch.Tensor, slots: torch.Tensor,
                 gate: torch.Tensor, norm_weight: torch.Tensor, eps: float, out: torch.Tensor,
                 block_v: int, store_state: bool, precision: str | None = None) -> None:
    """One launch over (sequence, head, value block), arguments already checked by
    ``kda_window``: writes ``out`` (normalised when block_v == V, else raw o for
    ``_gate_norm_kernel``) and, with ``store_state``, the states at ``slots``.
    ``precision``: tl.dot input precision of the fp32 dots (default "tf32x3" on CUDA, else
    "ieee"; the interpreter computes in fp32 either way)."""
    t_len, heads, dk = k.shape
    dv, n_seq = v.shape[-1], slots.shape[0]
    n = t_len // n_seq
    if not 1 <= n <= ROWS:
        raise ValueError(f"the chunk form takes 1..{ROWS} tokens per sequence, not {n}")
    if block_v < 16 or dk < 16:
        raise ValueError(f"the chunk form's dots need K, block_v >= 16 (K={dk}, {block_v})")
    precision = precision or ("tf32x3" if k.is_cuda else "ieee")
    _chunk_kernel[(n_seq, heads, dv // block_v)](
        q, k, v, g, beta, recurrent, slots, gate, norm_weight, out, n, heads, float(eps),
        recurrent.stride(0), gate.stride(0), out.stride(0), K=dk, V=dv, BV=block_v, R=ROWS,
        STORE_STATE=store_state, PRECISE=k.is_cuda, DOT=precision,
        num_warps=chunk_num_warps(dk, block_v))
