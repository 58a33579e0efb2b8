"""KDA delta rule over a uniform step's window, state read and written in place at its slot,
with the layer's gated head norm fused on the way out (``ref.kda_window_ref``).

One program per (sequence, head, block of value columns) holds that K x BV slice of the head's
fp32 state in registers (the delta rule never mixes value columns), runs the n steps of the
window (decode n = 1, verify n = D) in the order of ``kda.ref.kda_recurrent_ref``, writes each
step's gated, normalised output o = RMSNorm_{o_norm}(o_h) * sigmoid(gate_h) in the
activation dtype (what the output projection reads), and stores the final state back at the
sequence's slot unless ``store_state`` is False (speculative verify: the commit replays the
accepted steps). So a step's state crosses HBM once each way: no gather, no scatter copies. Knows
nothing about where q, k, v, g, beta and the gate came from.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmlab.kernels.decode import kda_window_chunk_triton as chunk
from glmlab.kernels.fused.mhc_triton import _sigmoid


@triton.jit
def _window_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, slots_ptr, gate_ptr,
                   nw_ptr, out_ptr, n, H, eps, stride_ss, stride_gate, stride_out,
                   K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                   STORE_STATE: tl.constexpr, PRECISE: tl.constexpr):
    # The delta rule is independent per value column (u, the update and o of column v read only
    # column v of the state), so a program may hold a [K, BV] slice: more programs in flight per
    # SM, fewer registers each. The head norm needs all V columns: with BV < V the program
    # writes o in the activation dtype and ``_gate_norm_kernel`` finishes it.
    seq, head, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    rk, cv = tl.arange(0, K), vb * BV + tl.arange(0, BV)
    st = state_ptr + slot * stride_ss + head * K * V + rk[:, None] * V + cv[None, :]
    s = tl.load(st).to(tl.float32)  # [K, BV]
    if BV == V:
        nw = tl.load(nw_ptr + cv).to(tl.float32)
    for t in range(n):
        tok = (seq * n + t).to(tl.int64)
        at_k = (tok * H + head) * K + rk
        kk = tl.load(k_ptr + at_k)
        s = s * tl.exp(tl.load(g_ptr + at_k))[:, None]
        v = tl.load(v_ptr + (tok * H + head) * V + cv).to(tl.float32)
        beta = tl.load(beta_ptr + tok * H + head).to(tl.float32)
        u = beta * (v - tl.sum(s * kk[:, None], axis=0))
        s = s + kk[:, None] * u[None, :]
        o = tl.sum(s * tl.load(q_ptr + at_k)[:, None], axis=0)  # [BV]
        act = out_ptr.dtype.element_ty
        if BV == V:
            gate = tl.load(gate_ptr + tok * stride_gate + head * V + cv)
            of = o.to(act).to(tl.float32)
            of = of * (1.0 / tl.sqrt(tl.sum(of * of, axis=0) / V + eps))
            y = nw * of * _sigmoid(gate.to(tl.float32), PRECISE)
            tl.store(out_ptr + tok * stride_out + head * V + cv, y.to(act))
        else:
            tl.store(out_ptr + tok * stride_out + head * V + cv, o.to(act))
    if STORE_STATE:
        tl.store(st, s.to(state_ptr.dtype.element_ty))


@triton.jit
def _gate_norm_kernel(out_ptr, gate_ptr, nw_ptr, H, eps, stride_gate, stride_out,
                      V: tl.constexpr, PRECISE: tl.constexpr):
    """In place: o -> RMSNorm_{o_norm}(o) * sigmoid(gate) per (token, head), as the fused path."""
    tok, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cv = tl.arange(0, V)
    at = out_ptr + tok * stride_out + head * V + cv
    o = tl.load(at)
    of = o.to(tl.float32)
    of = of * (1.0 / tl.sqrt(tl.sum(of * of, axis=0) / V + eps))
    gate = tl.load(gate_ptr + tok * stride_gate + head * V + cv).to(tl.float32)
    y = tl.load(nw_ptr + cv).to(tl.float32) * of * _sigmoid(gate, PRECISE)
    tl.store(at, y.to(o.dtype))


def value_block(dk: int, dv: int, n_seq: int, heads: int, num_sms: int = 132) -> int:
    """Columns of the state per program: the whole head while (sequence, head) programs fill
    the GPU and the state fits a program's registers (K x V <= 8192 fp32 values), else slices
    of 32 (a 128 x 128 head in four programs; the norm then runs as a second small kernel)."""
    if dk * dv <= 8192 and n_seq * heads >= 4 * num_sms or dv <= 32:
        return dv
    return 32


def window_warps(dk: int, block_v: int) -> int:
    """Warps per recurrent program. Measured on the H200 at 128 x 128 heads with 32-column slices
    (``--op kda-window --recurrent-warps 1,2,4,8``, commit 76253ea): 2 warps took 534 us at
    132 x 8 and 77 us at 16 x 8 against 688 and 98 us with 4 (8: 2.3-2.5x slower; 128 x 1 the
    same with 1, 2 or 4): the step's two reductions over K stay within fewer warps. Whole-head
    slices (K x V >= 8,192 values) keep 8 warps for their registers."""
    if dk * block_v >= 8192:
        return 8
    return 2 if block_v <= 32 else 4


def window_method(n: int, method: str | None = None, dk: int = 128,
                  block_v: int | None = None) -> str:
    """The kernel for a window of n tokens: the step-by-step recurrence unless ``method`` asks
    for the chunk (matrix) form. The chunk form was written for verify windows (2..16 tokens on
    tensor cores) but measured slower on the H200 at real width (64 heads of 128 x 128, fp32
    state, ``--op kda-window``, commit e8c7e4e): 132 x 8 took 974-1,284 us against the
    recurrence's 688 us, 16 x 8 133-171 us against 98 us (``data/bench/kda_window.jsonl``). It
    stays selectable, tested against the reference, for the next attempt at its schedule."""
    if method is None:
        return "recurrent"
    if method not in ("recurrent", "chunk"):
        raise ValueError(f"method must be 'recurrent' or 'chunk', not {method!r}")
    if method == "chunk" and (dk < 16 or (block_v is not None and block_v < 16)):
        raise ValueError(f"the chunk form's dots need K and the value block >= 16 (K={dk}, "
                         f"block_v={block_v})")
    return method


def kda_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, recurrent: torch.Tensor, slots: torch.Tensor,
               gate: torch.Tensor, norm_weight: torch.Tensor, eps: float,
               store_state: bool = True, block_v: int | None = None,
               method: str | None = None, dot_precision: str | None = None,
               num_warps: int | None = None) -> torch.Tensor:
    """``ref.kda_window_ref`` in one launch: out [T, H*V] in gate.dtype; ``recurrent`` updated.

    Args:
        q, k, g: [T, H, K] fp32 contiguous (q normalised and scaled, k normalised).
        v: [T, H, V]; beta: [T, H] (contiguous).  recurrent: [S, H, K, V] (fp32 or bf16).
        slots: [N] (T = N * n).  gate: [T, H*V] (rows may be strided).  norm_weight: [V].
        block_v: state columns per program (default ``value_block`` / ``chunk_value_block``).
        method: "recurrent" (``_window_kernel``, step by step) or "chunk"
            (``kda_window_chunk_triton``: the window as one matrix-form chunk on tensor cores);
            default ``window_method(n)``.  dot_precision: the chunk form's tl.dot precision.
        num_warps: the recurrence's warps per program (default ``window_warps``).
    """
    t_len, heads, dk = k.shape
    dv = v.shape[-1]
    n_seq = slots.shape[0]
    if n_seq == 0 or t_len % n_seq or recurrent.shape[1:] != (heads, dk, dv):
        raise ValueError(f"{t_len} tokens over {n_seq} sequences with state "
                         f"{tuple(recurrent.shape)}: not a uniform step of this layer")
    if not all(t.is_contiguous() for t in (q, k, v, g, beta)) or not recurrent[0].is_contiguous():
        raise ValueError("q, k, v, g, beta and each state slot must be contiguous")
    if gate.shape != (t_len, heads * dv) or gate.stride(-1) != 1:
        raise ValueError(f"gate must be [{t_len}, {heads * dv}] with a contiguous last dim")
    out = torch.empty(t_len, heads * dv, dtype=gate.dtype, device=k.device)
    method = window_method(t_len // n_seq, method, dk, block_v)
    if method == "chunk":
        bv = block_v or chunk.chunk_value_block(dk, dv)
    else:
        bv = block_v or value_block(dk, dv, n_seq, heads)
    if dv % bv:
        raise ValueError(f"value block {bv} must divide V={dv}")
    if method == "chunk":
        chunk.launch_chunk(q, k, v, g, beta, recurrent, slots, gate, norm_weight, eps, out, bv,
                           store_state, dot_precision)
    else:
        _window_kernel[(n_seq, heads, dv // bv)](
            q, k, v, g, beta, recurrent, slots, gate, norm_weight, out, t_len // n_seq, heads,
            float(eps), recurrent.stride(0), gate.stride(0), out.stride(0), K=dk, V=dv, BV=bv,
            STORE_STATE=store_state, PRECISE=k.is_cuda,
            num_warps=num_warps or window_warps(dk, bv))
    if bv < dv:
        _gate_norm_kernel[(t_len, heads)](out, gate, norm_weight, heads, float(eps),
                                          gate.stride(0), out.stride(0), V=dv,
                                          PRECISE=k.is_cuda, num_warps=1)
    return out
