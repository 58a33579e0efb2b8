"""The MoE router in one Triton kernel: fp32 logits, sigmoid, biased top-k, renormalise, scale.

``route(h, weight, bias, top_k, scaling)`` is ``ref.router_ref``: logits = h W^T in fp32
(exact products of the bf16 operands, fp32 sums; IEEE fp32 dots for fp32 operands), s =
sigmoid(logits), the top-k of s + e_score_correction_bias (the bias steers selection only; ties go
to the lower expert id), weights = s_chosen / (sum + 1e-20) * routed_scaling.

So that a decode step's few tokens still spread over the GPU, the logits are split over expert
blocks and K ranges; the program drawing the last ticket of a token block (``tickets.py``) sums
the K partials in a fixed order and runs the selection. GLM-5.3-Flash routes with one expert
group (``n_group = topk_group = 1``), so there is no group-limited stage. Knows nothing about
the experts themselves.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmlab.kernels.fused.mhc_triton import _sigmoid
from glmlab.kernels.fused.tickets import ticket_counters


@triton.jit
def _router_kernel(h_ptr, w_ptr, bias_ptr, ws_ptr, wout_ptr, iout_ptr, ticket_ptr,
                   T, E, D, stride_h, stride_w, scaling,
                   TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr,
                   BT: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr, KS: tl.constexpr,
                   RENORMALIZE: tl.constexpr, DOT_FP32: tl.constexpr, PRECISE: tl.constexpr):
    tb, eb, ks = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = tb * BT + tl.arange(0, BT)
    r_ok = rows < T
    es = eb * BE + tl.arange(0, BE)
    e_ok = es < E
    kk = tl.arange(0, BK)
    k_blocks = tl.cdiv(D, BK)
    per = tl.cdiv(k_blocks, KS)
    acc = tl.zeros([BT, BE], dtype=tl.float32)
    for kb in range(ks * per, tl.minimum(ks * per + per, k_blocks)):
        k = kb * BK + kk
        k_ok = k < D
        a = tl.load(h_ptr + rows.to(tl.int64)[:, None] * stride_h + k[None, :],
                    mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + es.to(tl.int64)[:, None] * stride_w + k[None, :],
                    mask=e_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT_FP32:
            acc += tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(a.to(b.dtype), tl.trans(b))
    # partial logits [KS, T, E_PAD]; the last of the token block's E/BE * KS programs selects
    tl.store(ws_ptr + (ks * T + rows.to(tl.int64))[:, None] * E_PAD + es[None, :], acc,
             mask=r_ok[:, None] & e_ok[None, :])
    tl.debug_barrier()
    if tl.atomic_add(ticket_ptr + tb, 1, sem="acq_rel") != tl.num_programs(1) * KS - 1:
        return
    cols = tl.arange(0, E_PAD)
    c_ok = cols < E
    logits = tl.zeros([BT, E_PAD], dtype=tl.float32)
    for s in range(KS):
        logits += tl.load(ws_ptr + (s * T + rows.to(tl.int64))[:, None] * E_PAD + cols[None, :],
                          mask=r_ok[:, None] & c_ok[None, :], other=0.0, cache_modifier=".cg")
    tl.atomic_xchg(ticket_ptr + tb, 0)
    score = _sigmoid(logits, PRECISE)
    bias = tl.load(bias_ptr + cols, mask=c_ok, other=0.0).to(tl.float32)
    select = tl.where(c_ok[None, :], score + bias[None, :], float("-inf"))
    slots = tl.arange(0, K_PAD)
    chosen_w = tl.zeros([BT, K_PAD], dtype=tl.float32)
    chosen_id = tl.zeros([BT, K_PAD], dtype=tl.int32)
    total = tl.zeros([BT], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.argmax(select, axis=1).to(tl.int32)  # ties: the lowest expert id
        hit = cols[None, :] == best[:, None]
        w = tl.sum(tl.where(hit, score, 0.0), axis=1)
        chosen_w = tl.where(slots[None, :] == j, w[:, None], chosen_w)
        chosen_id = tl.where(slots[None, :] == j, best[:, None], chosen_id)
        total += w
        select = tl.where(hit, float("-inf"), select)
    if RENORMALIZE:
        chosen_w = chosen_w / (total[:, None] + 1e-20)
    at = rows[:, None] * TOP_K + slots[None, :]
    ok = r_ok[:, None] & (slots[None, :] < TOP_K)
    tl.store(wout_ptr + at, chosen_w * scaling, mask=ok)
    tl.store(iout_ptr + at, chosen_id, mask=ok)


def route(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int,
          scaling: float, renormalize: bool = True, num_sms: int = 132
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid top-k routing of ``h`` [T, D] over ``weight`` [E, D] (``ref.router_ref``).

    Returns weights [T, A] fp32 and ids [T, A] int32 (slot 0 the best biased score).
    """
    t, d = h.shape
    e = weight.shape[0]
    if weight.shape[1] != d or bias.shape != (e,) or not 1 <= top_k <= e:
        raise ValueError(f"router weight {tuple(weight.shape)}, bias {tuple(bias.shape)}, "
                         f"top_k {top_k} do not fit h {tuple(h.shape)}")
    dev = h.device
    weights = torch.empty(t, top_k, dtype=torch.float32, device=dev)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=dev)
    if t == 0:
        return weights, ids
    bt, be, bk = 16, 16, 128
    e_pad = triton.next_power_of_2(max(e, be))
    t_blocks, e_blocks, k_blocks = triton.cdiv(t, bt), triton.cdiv(e, be), triton.cdiv(d, bk)
    ks = 1
    while t_blocks * e_blocks * ks < 2 * num_sms and ks * 4 <= k_blocks:
        ks *= 2
    ws = torch.empty(ks, t, e_pad, dtype=torch.float32, device=dev)
    h = h if h.stride(-1) == 1 else h.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    fp32 = h.dtype == torch.float32 or weight.dtype == torch.float32
    _router_kernel[(t_blocks, e_blocks, ks)](
        h, weight, bias.float().contiguous(), ws, weights, ids, ticket_counters(dev, t_blocks),
        t, e, d, h.stride(0), weight.stride(0), float(scaling), TOP_K=top_k,
        K_PAD=triton.next_power_of_2(top_k), E_PAD=e_pad, BT=bt, BE=be, BK=bk, KS=ks,
        RENORMALIZE=renormalize, DOT_FP32=fp32, PRECISE=h.is_cuda, num_warps=4)
    return weights, ids
