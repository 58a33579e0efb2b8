"""CUDA-core block-FP8 GEMV for a few tokens: the ``kind="gemv"`` program of ``linear_fp8``.

At a token or two the tensor-core path pads the tokens to 16 and the GEMM is a pure weight
stream (``gemm_configs``' docstring has the arithmetic and the H200 measurements), so this
program skips the tensor cores: each one owns ``block_n`` weight rows and one K split, loads
``[block_n, block_k]`` E4M3 weights per step as whole contiguous row segments (``block_k`` = 256
or 512: two to four 128-channel scale groups), converts them to fp32 once and multiplies them
with each token's E4M3 activations on the CUDA cores. Each 128-group's partial sum is scaled by
that group's weight scale and token scale before it joins the fp32 accumulator, as the
tensor-core kernel does per K step.
Activations are quantised in the prologue with ``quant_triton.group_scale`` (bit-identical to
``ref.quant_act_fp8``) or passed in E4M3 with their scales. The split-K ticket reduction and the
residual epilogue are ``gemm_triton.finish_tile``'s, so both kinds round identically.
"""

from __future__ import annotations

import triton
import triton.language as tl

from glmlab.kernels.fp8.gemm_triton import finish_tile
from glmlab.kernels.fp8.quant_triton import group_scale


@triton.jit(do_not_specialize=["M"])
def _gemv_fp8_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr, res_ptr, ws_ptr, ticket_ptr,
    M, N, K, stride_am, stride_asm, stride_bn, stride_bsn, stride_cm, stride_rm,
    A_FP8: tl.constexpr, HAS_RES: tl.constexpr, SPLIT_K: tl.constexpr,
    SCALE_BY_RECIPROCAL: tl.constexpr, FP8_MAX_C: tl.constexpr, INV_FP8_MAX_C: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
):
    # Same program numbering as _linear_fp8_kernel, so finish_tile's tickets and workspace agree;
    # launches normally have one M block (block_m >= M), more only when a table entry tuned at a
    # smaller M is reused for a larger one.
    tile = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    pid_m = tile % num_m
    pid_n = tile // num_m
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_ok = offs_n < N
    G: tl.constexpr = BK // GROUP_K  # scale groups per step
    offs_g = tl.arange(0, G)
    offs_c = tl.arange(0, GROUP_K)
    k_groups = tl.cdiv(K, GROUP_K)
    k_blocks = tl.cdiv(K, BK)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    kb_start = tl.program_id(1) * per_split
    kb_end = tl.minimum(kb_start + per_split, k_blocks)
    w_rows = b_ptr + offs_n.to(tl.int64)[:, None, None] * stride_bn
    w_scale_rows = b_scale_ptr + (offs_n // GROUP_N)[:, None] * stride_bsn
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for kb in range(kb_start, kb_end):
        g = kb * G + offs_g
        g_ok = g < k_groups
        k = g[:, None] * GROUP_K + offs_c[None, :]  # [G, GROUP_K]: this step's channels by group
        k_ok = k < K
        # the one HBM stream of the kernel: converted once, reused by every token below
        w = tl.load(w_rows + k[None, :, :], mask=n_ok[:, None, None] & k_ok[None, :, :],
                    other=0.0).to(tl.float32)
        w_s = tl.load(w_scale_rows + g[None, :], mask=n_ok[:, None] & g_ok[None, :], other=0.0)
        for i in tl.static_range(BM):
            row = pid_m * BM + i
            row_ok = row < M
            x = tl.load(a_ptr + row.to(tl.int64) * stride_am + k, mask=k_ok & row_ok, other=0.0)
            if A_FP8:
                x_s = tl.load(a_scale_ptr + row * stride_asm + g, mask=g_ok & row_ok, other=0.0)
                xq = x.to(tl.float32)
            else:  # the quant_act_fp8 recipe on each 128-channel group of this token
                xf = x.to(tl.float32)
                x_s = group_scale(tl.max(tl.abs(xf), axis=1), FP8_MAX_C, INV_FP8_MAX_C, G,
                                  SCALE_BY_RECIPROCAL)
                xf = tl.math.div_rn(xf, x_s[:, None] + tl.zeros_like(xf))  # no broadcasting
                xq = tl.minimum(tl.maximum(xf, -FP8_MAX_C), FP8_MAX_C).to(tl.float8e4nv)
                xq = xq.to(tl.float32)
            part = tl.sum(w * xq[None, :, :], axis=2)  # [BN, G]: one partial per scale group
            y = tl.sum(part * w_s * x_s[None, :], axis=1)  # [BN]
            acc += tl.where(tl.arange(0, BM)[:, None] == i, y[None, :], 0.0)
    finish_tile(acc, tile, offs_m, offs_n, M, N, c_ptr, res_ptr, ws_ptr, ticket_ptr, stride_cm,
                stride_rm, HAS_RES, SPLIT_K, BM, BN)
