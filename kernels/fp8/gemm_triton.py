"""Block-FP8 dense GEMM in Triton: y = x W^T with E4M3 weights and per-token-group E4M3 activations.

The recipe (``ref.linear_fp8_ref``): W [N, K] is E4M3 with one fp32 multiplier per 128 x 128
block (``weight_scale_inv``); x [M, K] is quantised per token per 128 channels exactly as
``ref.quant_act_fp8`` does on the same device (``quant_triton.group_scale``); every 128-deep K step
is one E4M3 dot into fp32, multiplied by the step's activation scale (per row) and weight scale
(per 128-row block of W) and added to an fp32 accumulator. The output is rounded once to the
output dtype; an optional residual is added after that rounding (the unfused ``linear + add``).

Program kinds (``gemm_configs.GemmConfig``; the kernels know nothing about how one was chosen):

- tile: an output tile [block_m tokens, block_n columns] on the tensor cores;
- swap-AB: the same tile computed transposed, C^T = W X^T, so that weight rows are the dot's M
  side (wgmma needs 64) when only a few tokens are there: the small-M path that streams W;
- gemv (``gemv_triton``): the same stream on the CUDA cores for one to four tokens;
- scaled_mm (``scaled_mm``): ``torch._scaled_mm``'s block-wise cuBLASLt GEMM, where a tuned
  table found it fastest.

The Triton kinds may split K over ``split_k`` programs. Each writes its fp32 partial to a
workspace, then takes a ticket from a per-tile counter; the program that draws the last ticket
adds the partials in split order (deterministic: bit-identical every run and inside a CUDA
graph), applies the epilogue (``finish_tile``, shared by both Triton kernels) and resets the
counter to zero for the next launch. No host synchronisation, no data-dependent shapes. The
counters are one persistent int32 buffer per device, so two split-K launches must not run
concurrently on different streams (``kernels/fused/tickets.py``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from glmlab.kernels.fp8 import interpret_casts, scaled_mm
from glmlab.kernels.fp8.gemm_configs import (
    GROUP,
    GemmConfig,
    cached_table,
    choose_config,
    rule_config,
)
from glmlab.kernels.fp8.quant_triton import INV_FP8_MAX, group_scale, quant_act_fp8_triton
from glmlab.kernels.fp8.ref import FP8, FP8_MAX
from glmlab.kernels.fused.tickets import ticket_counters


@triton.jit(do_not_specialize=["M"])
def _linear_fp8_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, res_ptr, ws_ptr, ticket_ptr,
    M, N, K, stride_am, stride_asm, stride_bn, stride_bsn, stride_cm, stride_rm,
    A_FP8: tl.constexpr, HAS_RES: tl.constexpr, SWAP_AB: tl.constexpr, SPLIT_K: tl.constexpr,
    SCALE_BY_RECIPROCAL: tl.constexpr, FP8_MAX_C: tl.constexpr, INV_FP8_MAX_C: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_N: tl.constexpr,
):
    # Column-slab-major order: the M blocks that read one slab of W run next to each other, so a
    # slab crosses HBM once and the other M blocks find it in L2.
    tile = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    pid_m = tile % num_m
    pid_n = tile // num_m
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    m_ok = offs_m < M
    n_ok = offs_n < N
    k_blocks = tl.cdiv(K, BK)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    kb_start = tl.program_id(1) * per_split
    kb_end = tl.minimum(kb_start + per_split, k_blocks)
    a_rows = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am
    b_rows = b_ptr + offs_n.to(tl.int64)[:, None] * stride_bn
    b_scale_rows = b_scale_ptr + (offs_n // GROUP_N) * stride_bsn
    if SWAP_AB:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    for kb in range(kb_start, kb_end):
        k = kb * BK + offs_k
        k_ok = k < K
        a = tl.load(a_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if A_FP8:
            a_s = tl.load(a_scale_ptr + offs_m * stride_asm + kb, mask=m_ok, other=0.0)
        else:  # the quant_act_fp8 recipe on this 128-channel group of every row
            af = a.to(tl.float32)
            a_s = group_scale(tl.max(tl.abs(af), axis=1), FP8_MAX_C, INV_FP8_MAX_C, BM,
                              SCALE_BY_RECIPROCAL)
            af = tl.math.div_rn(af, a_s[:, None] + tl.zeros_like(af))  # div_rn does not broadcast
            a = tl.minimum(tl.maximum(af, -FP8_MAX_C), FP8_MAX_C).to(tl.float8e4nv)
        b = tl.load(b_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        b_s = tl.load(b_scale_rows + kb, mask=n_ok, other=0.0)
        if SWAP_AB:
            acc += tl.dot(b, tl.trans(a)) * b_s[:, None] * a_s[None, :]
        else:
            acc += tl.dot(a, tl.trans(b)) * a_s[:, None] * b_s[None, :]
    if SWAP_AB:
        acc = tl.trans(acc)  # [BM, BN]
    finish_tile(acc, tile, offs_m, offs_n, M, N, c_ptr, res_ptr, ws_ptr, ticket_ptr, stride_cm,
                stride_rm, HAS_RES, SPLIT_K, BM, BN)


@triton.jit
def finish_tile(acc, tile, offs_m, offs_n, M, N, c_ptr, res_ptr, ws_ptr, ticket_ptr, stride_cm,
                stride_rm, HAS_RES: tl.constexpr, SPLIT_K: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr):
    """Split-K reduction and epilogue of one [BM, BN] fp32 output tile (every program kind of
    ``linear_fp8`` ends here, so they reduce and round identically)."""
    out_ok = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    mn = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    if SPLIT_K > 1:
        tl.store(ws_ptr + tl.program_id(1).to(tl.int64) * M * N + mn, acc, mask=out_ok)
        tl.debug_barrier()  # every thread's partial is written before the ticket is taken
        ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel")
        last = ticket == SPLIT_K - 1
        if last:
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            for s in range(SPLIT_K):  # fixed order: the same bits however the programs ran
                acc += tl.load(ws_ptr + s * M * N + mn, mask=out_ok, other=0.0,
                               cache_modifier=".cg")
            tl.atomic_xchg(ticket_ptr + tile, 0)  # ready for the next launch (and graph replay)
        out_ok = out_ok & last  # the other programs' masked epilogue touches no memory
    y = acc.to(c_ptr.dtype.element_ty)
    if HAS_RES:
        r = tl.load(res_ptr + offs_m.to(tl.int64)[:, None] * stride_rm + offs_n[None, :],
                    mask=out_ok, other=0.0)
        y = (y.to(tl.float32) + r.to(tl.float32)).to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :], y, mask=out_ok)


@functools.cache
def _device_name_of(index: int | None) -> str:
    return torch.cuda.get_device_name(index)


def _device_name(device: torch.device) -> str:
    """The name tuned tables are keyed by (``torch.cuda.get_device_name``), or ``cpu``."""
    return _device_name_of(device.index) if device.type == "cuda" else device.type


def linear_fp8(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               block: tuple[int, int] = (GROUP, GROUP), x_scale: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
               config: GemmConfig | None = None) -> torch.Tensor:
    """Block-FP8 ``x @ weight.T`` (+ residual).

    Args:
        x: [M, K] activations (bf16 / fp16 / fp32), or E4M3 with ``x_scale`` [M, ceil(K/128)].
        weight: [N, K] float8_e4m3fn, K contiguous.  weight_scale: [ceil(N/bn), ceil(K/128)] fp32.
        block: the weight's scale block; (128, 128) as published (bn may be any multiple of 16).
        residual: [M, N] added after the product is rounded to the output dtype.
        out_dtype: default x.dtype (bf16 when x is E4M3).
        config: kind and tiles; default ``choose_config(M, N, K)`` (a tuned ``scaled_mm`` pick
            that this call cannot take falls back to the rule). A config without
            ``fuse_quant`` makes this call quantise x first (``quant_act_fp8_triton``) when x
            is not E4M3 already.
    Returns:
        [M, N] in ``out_dtype``.

    Example:
        >>> y = linear_fp8(torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16), w, s)
    """
    if weight.dtype != FP8 or weight.dim() != 2 or x.dim() != 2:
        raise ValueError(f"want x [M, K] and an E4M3 weight [N, K]; got x {tuple(x.shape)}, "
                         f"weight {weight.dtype}{tuple(weight.shape)}")
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k or block[1] != GROUP:
        raise ValueError(f"x has K={k}, weight {tuple(weight.shape)} with block {block}: the K "
                         f"block must be {GROUP} and the K sizes must agree")
    want_scale = (-(-n // block[0]), -(-k // GROUP))
    if tuple(weight_scale.shape) != want_scale:
        raise ValueError(f"weight_scale is {tuple(weight_scale.shape)}, expected {want_scale}")
    out_dtype = out_dtype or (torch.bfloat16 if x.dtype == FP8 else x.dtype)
    out = torch.empty(m, n, dtype=out_dtype, device=x.device)
    if m == 0:
        return out
    if not x.is_cuda:
        interpret_casts.install()
    cfg = config or choose_config(m, n, k, table=cached_table(_device_name(x.device)))
    refused = scaled_mm.unsupported_reason(n, k, block, x.device, out_dtype) \
        if cfg.kind == "scaled_mm" else None
    if refused and config is None:  # a table entry for a call it cannot take: the rule's pick
        cfg = rule_config(m, n, k)
    elif refused:
        raise ValueError(refused)
    if x.dtype != FP8 and not cfg.fuse_quant:
        x, x_scale = quant_act_fp8_triton(x, GROUP)
    a_fp8 = x.dtype == FP8
    if a_fp8 and (x_scale is None or tuple(x_scale.shape) != (m, want_scale[1])):
        raise ValueError(f"E4M3 x needs x_scale [{m}, {want_scale[1]}]")
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    weight_scale = weight_scale.float().contiguous()
    x_scale = x_scale.contiguous() if a_fp8 else None
    if residual is not None and (tuple(residual.shape) != (m, n) or residual.stride(-1) != 1):
        raise ValueError(f"residual must be a row-major [{m}, {n}] tensor")
    if cfg.kind == "scaled_mm":
        return scaled_mm.scaled_mm_fp8(x, x_scale, weight, weight_scale, out_dtype, residual)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    if cfg.split_k > 1:
        ws = torch.empty(cfg.split_k, m, n, dtype=torch.float32, device=x.device)
        tickets = ticket_counters(x.device, tiles)
    else:
        ws = tickets = out
    xs = x_scale if a_fp8 else out
    res = residual if residual is not None else out
    if cfg.kind == "gemv":
        from glmlab.kernels.fp8 import gemv_triton  # here: it imports finish_tile from this module

        kernel, shape = gemv_triton._gemv_fp8_kernel, dict(GROUP_K=GROUP)
    else:
        kernel, shape = _linear_fp8_kernel, dict(SWAP_AB=cfg.swap_ab)
    kernel[(tiles, cfg.split_k)](
        x, xs, weight, weight_scale, out, res, ws, tickets,
        m, n, k, x.stride(0), xs.stride(0) if a_fp8 else 0, weight.stride(0),
        weight_scale.stride(0), out.stride(0), res.stride(0) if residual is not None else 0,
        A_FP8=a_fp8, HAS_RES=residual is not None, SPLIT_K=cfg.split_k,
        SCALE_BY_RECIPROCAL=x.is_cuda, FP8_MAX_C=FP8_MAX, INV_FP8_MAX_C=INV_FP8_MAX,
        BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, GROUP_N=block[0], **shape,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
