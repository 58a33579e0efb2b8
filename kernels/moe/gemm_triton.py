"""Triton grouped GEMMs of the MoE, block-FP8 (W8A8) or plain, over expert-aligned rows.

One kernel serves both projections; constexpr switches pick the row mapping:

- gate_up (``moe_gemm_up``): A rows are *gathered* from x through the sorted pair ids
  (token = pair // A); C = [max_rows, 2I] is written in aligned (padded-row) order.
- down (``moe_gemm_down``): A rows are the aligned rows themselves (no gather); the epilogue
  multiplies by the pair's routing weight and *scatters* C to row ``pair`` of [T*A, D].

Block-FP8: B (weights, [E, N, K] E4M3) has one scale per 128 x 128 block, A one scale per row per
128 K-channels; each BLOCK_K step does an fp8 dot into fp32 and adds it scaled by
``a_scale[row] * b_scale[col]`` (BLOCK_K must divide the 128 K-group so a step sees one scale).
Plain weights (bf16/fp16/fp32) use the same tiling with one fp32 accumulator. Under the CPU
interpreter dots run in fp32 (its bf16 dot is wrong, docs/platform.md section 2.1).

Tiles come from a ``KernelConfig`` (configs.py); the kernel knows nothing about how it was chosen.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmlab.kernels.fp8 import interpret_casts
from glmlab.kernels.moe.configs import KernelConfig, fit_stages
from glmlab.kernels.moe.routing_triton import AlignedPairs


# num_pairs / num_m_blocks change with the batch: one compiled kernel serves every M.
@triton.jit(do_not_specialize=["num_pairs", "num_m_blocks"])
def _moe_gemm_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, route_w_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    num_pairs, N, K, a_row_div, num_m_blocks,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_bse, stride_bsn, stride_bsk,
    GATHER_A: tl.constexpr, SCATTER_C: tl.constexpr, MUL_ROUTE_W: tl.constexpr,
    BLOCK_FP8: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    DOT_FP32: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):
    # Grouped launch order: GROUP_SIZE_M row blocks share each column block while it is in L2.
    pid = tl.program_id(0)
    num_n_blocks = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_SIZE_M * num_n_blocks
    first_m = (pid // per_group) * GROUP_SIZE_M
    group_rows = tl.minimum(num_m_blocks - first_m, GROUP_SIZE_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return

    offs_p = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # aligned rows
    pair = tl.load(sorted_ids_ptr + offs_p)  # pad slots hold num_pairs
    row_ok = pair < num_pairs
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if GATHER_A:
        a_rows = (pair // a_row_div).to(tl.int64)
    else:
        a_rows = offs_p.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak  # [BM, BK]
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
    if BLOCK_FP8:
        a_s_ptrs = a_scale_ptr + a_rows * stride_asm  # [BM]
        b_s_ptrs = b_scale_ptr + expert * stride_bse + (offs_n // GROUP_N) * stride_bsn  # [BN]

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = offs_k < K - k0
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if BLOCK_FP8:
            a_s = tl.load(a_s_ptrs + (k0 // GROUP_K) * stride_ask, mask=row_ok, other=0.0)
            b_s = tl.load(b_s_ptrs + (k0 // GROUP_K) * stride_bsk, mask=n_ok, other=0.0)
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        elif DOT_FP32:
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32))
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if MUL_ROUTE_W:
        w = tl.load(route_w_ptr + pair, mask=row_ok, other=0.0)
        acc = acc * w[:, None]
    if SCATTER_C:  # skipped pairs and pad slots have no destination
        c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])
    else:  # pad rows are stored too (as zeros: their A rows were masked), so every aligned row
        # the next kernels read is defined
        c_ptrs = c_ptr + offs_p.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=n_ok[None, :])


def _check(cfg: KernelConfig, w: torch.Tensor, w_scale, group: tuple[int, int]) -> None:
    if w_scale is not None and group[1] % cfg.block_k:
        raise ValueError(f"BLOCK_SIZE_K {cfg.block_k} must divide the FP8 K-group {group[1]}")


def _launch(a, a_scale, w, w_scale, c, route_w, align: AlignedPairs, cfg: KernelConfig,
            group: tuple[int, int], gather: bool, scatter: bool) -> None:
    if align.block_m != cfg.block_m:
        raise ValueError(f"pairs aligned to {align.block_m} rows, config has BLOCK_SIZE_M "
                         f"{cfg.block_m}")
    _check(cfg, w, w_scale, group)
    cfg = fit_stages(cfg, max(a.element_size(), w.element_size()))
    if not a.is_cuda:
        interpret_casts.install()
    n, k = w.shape[1], w.shape[2]
    fp8 = w_scale is not None
    num_m_blocks = align.num_row_blocks
    grid = (num_m_blocks * triton.cdiv(n, cfg.block_n),)
    a_s = a_scale if fp8 else a
    w_s = w_scale if fp8 else w
    _moe_gemm_kernel[grid](
        a, a_s, w, w_s, c, route_w if route_w is not None else c,
        align.sorted_ids, align.expert_ids, align.num_padded,
        align.num_pairs, n, k, align.top_k if gather else 1, num_m_blocks,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), c.stride(0), c.stride(1),
        a_s.stride(0), a_s.stride(1), w_s.stride(0), w_s.stride(1), w_s.stride(2),
        GATHER_A=gather, SCATTER_C=scatter, MUL_ROUTE_W=route_w is not None,
        BLOCK_FP8=fp8, GROUP_N=group[0], GROUP_K=group[1], DOT_FP32=not a.is_cuda,
        EVEN_K=k % cfg.block_k == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, GROUP_SIZE_M=cfg.group_m, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)


def moe_gemm_up(x: torch.Tensor, x_scale: torch.Tensor | None, w13: torch.Tensor,
                w13_scale: torch.Tensor | None, align: AlignedPairs, cfg: KernelConfig,
                out_dtype: torch.dtype, group: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """gate_up projection of every routed pair, rows gathered from ``x`` by token.

    Args:
        x: [T, D] activations (E4M3 with ``x_scale`` [T, D/128] for block-FP8, else plain).
        w13: [E, 2I, D] (gate rows then up rows), E4M3 with ``w13_scale`` [E, 2I/128, D/128].
        align: pairs aligned to ``cfg.block_m``.
    Returns:
        [align.max_rows, 2I] in ``out_dtype``, aligned row order; pad rows are zeros, rows past
        ``align.num_padded`` unwritten.
    """
    h = torch.empty(align.max_rows, w13.shape[1], dtype=out_dtype, device=x.device)
    _launch(x, x_scale, w13, w13_scale, h, None, align, cfg, group, gather=True, scatter=False)
    return h


def moe_gemm_down(h: torch.Tensor, h_scale: torch.Tensor | None, w2: torch.Tensor,
                  w2_scale: torch.Tensor | None, route_w: torch.Tensor, align: AlignedPairs,
                  cfg: KernelConfig, out_dtype: torch.dtype, group: tuple[int, int] = (128, 128)
                  ) -> torch.Tensor:
    """down projection of the aligned rows, scaled by the routing weight, scattered by pair.

    Args:
        h: [align.max_rows, I] activated rows (E4M3 with ``h_scale`` [max_rows, I/128], or plain).
        w2: [E, D, I], E4M3 with ``w2_scale`` [E, D/128, I/128].  route_w: [T, A] fp32.
    Returns:
        [T * A, D] in ``out_dtype``: row ``t * A + a`` is slot a's weighted expert output;
        rows of skipped pairs (ids outside [0, E)) are unwritten.
    """
    out = torch.empty(align.num_pairs, w2.shape[1], dtype=out_dtype, device=h.device)
    _launch(h, h_scale, w2, w2_scale, out, route_w.reshape(-1).float(), align, cfg, group,
            gather=False, scatter=True)
    return out
