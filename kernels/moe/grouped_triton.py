"""Persistent grouped block-FP8 GEMMs of the MoE with fused epilogues (the path after gemm_triton).

One kernel, specialised by constexprs, serves both projections and both regimes:

- gate_up (``grouped_up``): a tile owns BLOCK_N gate columns *and* the matching BLOCK_N up
  columns (two accumulators), so the epilogue applies the clamped SwiGLU and the per-128-channel
  FP8 requantisation in registers and writes E4M3 + fp32 scales, the down GEMM's input; the bf16
  gate_up output never reaches memory. A rows are gathered from x by token.
- down (``grouped_down``): A rows are the aligned rows (loaded by TMA); the epilogue multiplies by
  the routing weight and scatters each row to its pair slot (``t * A + a``).

Schedule: a persistent grid (at most ``ctas_per_sm`` programs per SM) walks the tiles of the real
(device-side) aligned row count, so no host sync and no idle programs; consecutive tiles take
GROUP_M row blocks -- usually several experts -- for one column block, so a weight tile is read
from HBM once while its experts' row blocks run side by side, and the A rows stay in L2 across
column blocks. Weights are read through TMA descriptors ([E * N, K] view, [BLOCK_N, 128] boxes),
the K loop is software-pipelined ``num_stages`` deep, and every 128-wide K step does an FP8
tensor-core dot into fp32 that is added scaled by ``a_scale[row] * b_scale[col]`` (block-128
weights, per-token-group activations: the recipe of ``ref.moe_experts_fp8_ref``).
``warp_specialize`` asks Triton to split the loop into producer / consumer warps (Triton >= 3.6
has the Hopper pass); ``swap_ab`` computes C^T = B A^T so a small per-expert row count becomes
the MMA's N (>= 8) instead of padding the M side to 64: the decode regime, where the kernel is
a weight stream.

Numerics equal the unfused path: the gate_up accumulators are rounded to the activation dtype
(bf16) before the SwiGLU, which then repeats ``act_triton``'s roundings. Block-FP8 weights only
(plain weights use gemm_triton). The kernel knows nothing about how its config was chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.tools.tensor_descriptor import TensorDescriptor

from glmlab.kernels.fp8 import interpret_casts
from glmlab.kernels.fp8.quant_triton import INV_FP8_MAX, group_scale
from glmlab.kernels.fp8.ref import FP8, FP8_MAX
from glmlab.kernels.moe.routing_triton import AlignedPairs

BLOCK_K = 128  # one K step = one FP8 scale group


@dataclass(frozen=True)
class GroupedConfig:
    """One launch of the grouped kernel. ``block_n``: output columns per tile (gate_up: gate
    columns, the tile also computes as many up columns; must be 128 there, one quant group)."""

    block_m: int = 128
    block_n: int = 128
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    swap_ab: bool = False
    warp_specialize: bool = False
    ctas_per_sm: int = 1
    flatten: bool = False
    gather_a: bool = True  # gate_up: gather x rows in the kernel; False: pre-gathered, TMA

    def short(self) -> str:
        flags = ("S" if self.swap_ab else "") + ("W" if self.warp_specialize else "") + \
            ("F" if self.flatten else "") + ("" if self.gather_a else "T")
        return (f"M{self.block_m}N{self.block_n}G{self.group_m}w{self.num_warps}"
                f"s{self.num_stages}c{self.ctas_per_sm}{flags}")

    def smem_bytes(self, up: bool) -> int:
        b_rows = 2 * self.block_n if up else self.block_n
        return self.num_stages * (self.block_m + b_rows) * BLOCK_K


@triton.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    # GROUP_M row blocks (consecutive experts) per column block, row block fastest.
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % rows, (tile % per_group) // rows


@triton.jit
def _scaled_dot(acc, a, b, a_s, b_s, SWAP_AB: tl.constexpr, B_SCALAR: tl.constexpr):
    # a [BM, BK] e4m3, b [BN, BK] e4m3 (both K-major: the FP8 wgmma operand layout). The
    # product is scaled as (dot * a_s) * b_s, gemm_triton's order, and never as a [BM, BN]
    # scale matrix (registers). B_SCALAR: the tile lies in one 128-column scale block.
    if SWAP_AB:  # acc [BN, BM]
        d = tl.dot(b, tl.trans(a)) * a_s[None, :]
        if B_SCALAR:
            out = acc + d * b_s
        else:
            out = acc + d * b_s[:, None]
    else:
        d = tl.dot(a, tl.trans(b)) * a_s[:, None]
        if B_SCALAR:
            out = acc + d * b_s
        else:
            out = acc + d * b_s[None, :]
    return out


@triton.jit
def _swiglu_quant_tile(gate, up, limit, FP8_MAX_C: tl.constexpr, INV_FP8_MAX_C: tl.constexpr,
                       BLOCK_M: tl.constexpr, PRECISE: tl.constexpr, ACT: tl.constexpr):
    # gate/up [BM, 128] fp32 accumulators -> (q [BM, 128] fp32 in E4M3 range, scale [BM]);
    # the roundings of the unfused path: h stored in the activation dtype ACT, act_triton's
    # SwiGLU, quant_triton's scale and quotient.
    g = tl.minimum(gate.to(ACT).to(tl.float32), limit)
    u = tl.minimum(tl.maximum(up.to(ACT).to(tl.float32), -limit), limit)
    if PRECISE:  # torch's CUDA silu: x / (1 + expf(-x)), accurate expf, IEEE division
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    silu = tl.math.div_rn(g, 1.0 + e).to(ACT).to(tl.float32)
    y = (silu * u).to(ACT).to(tl.float32)
    amax = tl.max(tl.abs(y), axis=1)
    scale = group_scale(amax, FP8_MAX_C, INV_FP8_MAX_C, BLOCK_M, PRECISE)
    q = tl.math.div_rn(y, scale[:, None] + tl.zeros_like(y))
    return tl.minimum(tl.maximum(q, -FP8_MAX_C), FP8_MAX_C), scale


@triton.jit(do_not_specialize=["num_pairs"])
def _grouped_kernel(
    a_ptr, a_desc, a_scale_ptr, b_desc, b_scale_ptr, out_ptr, out_scale_ptr, route_w_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    num_pairs, N, K, b_rows_per_expert, a_row_div, limit,
    stride_am, stride_asm, stride_bse, stride_bsn, stride_om, stride_osm,
    UP: tl.constexpr, A_TMA: tl.constexpr, SWAP_AB: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, FLATTEN: tl.constexpr, PRECISE: tl.constexpr,
    FP8_MAX_C: tl.constexpr, INV_FP8_MAX_C: tl.constexpr, ACT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    num_m = tl.load(num_padded_ptr) // BLOCK_M  # real row blocks (device side)
    num_n = N // BLOCK_N
    num_tiles = num_m * num_n
    offs_k = tl.arange(0, BLOCK_K)
    # Triton's Hopper warp specialisation applies to an innermost loop (the K loop). FLATTEN
    # fuses the tile and K loops (the next tile's loads start under this tile's epilogue) at
    # the cost of registers (sm_90 AOT: spills at 128-row tiles).
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        offs_p = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # aligned rows
        pair = tl.load(sorted_ids_ptr + offs_p)  # pad slots hold num_pairs
        row_ok = pair < num_pairs
        expert = tl.load(expert_ids_ptr + pid_m)
        if A_TMA:
            a_rows = offs_p.to(tl.int64)
        else:
            a_rows = (pair // a_row_div).to(tl.int64)
        n0 = pid_n * BLOCK_N
        offs_n = n0 + tl.arange(0, BLOCK_N)
        b_row = expert * b_rows_per_expert + n0
        if BLOCK_N <= 128:
            bs_ptrs = b_scale_ptr + expert.to(tl.int64) * stride_bse + (n0 // 128) * stride_bsn
        else:
            bs_ptrs = (b_scale_ptr + expert.to(tl.int64) * stride_bse
                       + (offs_n // 128) * stride_bsn)
        as_ptrs = a_scale_ptr + a_rows * stride_asm
        if SWAP_AB:
            acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros_like(acc)
        for k0 in tl.range(0, K, BLOCK_K, warp_specialize=WARP_SPECIALIZE):
            kb = k0 // BLOCK_K
            if A_TMA:
                a = a_desc.load([pid_m * BLOCK_M, k0])
            else:
                a = tl.load(a_ptr + a_rows[:, None] * stride_am + (k0 + offs_k)[None, :],
                            mask=row_ok[:, None], other=0.0)
            a_s = tl.load(as_ptrs + kb, mask=row_ok, other=0.0)
            b = b_desc.load([b_row, k0])
            acc = _scaled_dot(acc, a, b, a_s, tl.load(bs_ptrs + kb), SWAP_AB, BLOCK_N <= 128)
            if UP:  # the matching up columns sit N rows further in w13
                b_u = b_desc.load([b_row + N, k0])
                acc_up = _scaled_dot(acc_up, a, b_u, a_s,
                                     tl.load(bs_ptrs + (N // 128) * stride_bsn + kb), SWAP_AB,
                                     True)
        if SWAP_AB:
            acc = tl.trans(acc)
            acc_up = tl.trans(acc_up)
        if UP:  # pad rows are written too (zeros), so every aligned row down reads is defined
            q, scale = _swiglu_quant_tile(acc, acc_up, limit, FP8_MAX_C, INV_FP8_MAX_C, BLOCK_M,
                                          PRECISE, ACT)
            rows64 = offs_p.to(tl.int64)
            tl.store(out_ptr + rows64[:, None] * stride_om + offs_n[None, :],
                     q.to(out_ptr.dtype.element_ty))
            tl.store(out_scale_ptr + rows64 * stride_osm + pid_n, scale)
        else:  # weighted scatter: skipped pairs and pad slots have no destination
            w = tl.load(route_w_ptr + pair, mask=row_ok, other=0.0)
            c = acc * w[:, None]
            tl.store(out_ptr + pair.to(tl.int64)[:, None] * stride_om + offs_n[None, :],
                     c.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter runs programs one by one; a few exercise the tile loop
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check(cfg: GroupedConfig, align: AlignedPairs, w: torch.Tensor, w_scale, up: bool) -> None:
    if align.block_m != cfg.block_m:
        raise ValueError(f"pairs aligned to {align.block_m} rows, config has block_m "
                         f"{cfg.block_m}")
    if w.dtype != FP8 or w_scale is None:
        raise ValueError("the grouped kernel takes block-FP8 (E4M3 + block scales) weights only")
    n_out = w.shape[1] // 2 if up else w.shape[1]
    if up and cfg.block_n != 128:
        raise ValueError("gate_up tiles must be 128 columns wide (one quant group)")
    if n_out % cfg.block_n or w.shape[2] % BLOCK_K:
        raise ValueError(f"N={n_out} must be a multiple of block_n {cfg.block_n} and "
                         f"K={w.shape[2]} of {BLOCK_K}")


_ACT = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def _launch(a, a_scale, w, w_scale, out, out_scale, route_w, align, cfg, up, limit, act):
    _check(cfg, align, w, w_scale, up)
    if not a.is_cuda:
        interpret_casts.install()
    e, n_w, k = w.shape
    n_out = n_w // 2 if up else n_w
    a_tma = not (up and cfg.gather_a)
    if a_tma and a.shape[0] != align.max_rows:
        raise ValueError(f"TMA-read A must hold the {align.max_rows} aligned rows, got "
                         f"{a.shape[0]} (gate_up with gather_a=False takes gather_quant's rows)")
    if cfg.warp_specialize and not a_tma:
        # Triton 3.6's Hopper pass aborts the process on pointer-gathered operands
        raise ValueError("warp_specialize needs TMA operands: use gather_a=False")
    b_desc = TensorDescriptor.from_tensor(w.view(e * n_w, k), [cfg.block_n, BLOCK_K])
    a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, BLOCK_K]) if a_tma else None
    max_tiles = align.num_row_blocks * (n_out // cfg.block_n)
    grid = (max(1, min(max_tiles, _num_sms(a.device) * cfg.ctas_per_sm)),)
    _grouped_kernel[grid](
        a, a_desc, a_scale, b_desc, w_scale, out, out_scale if up else out,
        route_w if route_w is not None else a_scale, align.sorted_ids, align.expert_ids,
        align.num_padded, align.num_pairs, n_out, k, n_w, align.top_k if up else 1,
        float(limit), a.stride(0), a_scale.stride(0), w_scale.stride(0), w_scale.stride(1),
        out.stride(0), out_scale.stride(0) if up else 0,
        UP=up, A_TMA=a_tma, SWAP_AB=cfg.swap_ab, WARP_SPECIALIZE=cfg.warp_specialize,
        FLATTEN=cfg.flatten, PRECISE=a.is_cuda, FP8_MAX_C=FP8_MAX, INV_FP8_MAX_C=INV_FP8_MAX,
        ACT=_ACT[act],
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=BLOCK_K, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def grouped_up(xq: torch.Tensor, xs: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
               align: AlignedPairs, cfg: GroupedConfig, limit: float,
               act_dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """gate_up GEMM of every aligned row with the clamped SwiGLU + FP8 requant fused.

    Args:
        xq: [T, D] E4M3, xs: [T, D/128] fp32 (per-token-group); with ``cfg.gather_a`` False
        the aligned rows ``permute_triton.gather_quant`` writes instead.  w13: [E, 2I, D] E4M3 (gate
        rows then up rows), w13_scale [E, 2I/128, D/128].  align: pairs aligned to cfg.block_m.
    Returns:
        h8 [max_rows, I] E4M3 and hs [max_rows, I/128] fp32 in aligned row order (pad rows are
        zeros; rows past ``align.num_padded`` unwritten): what ``swiglu_quant`` gives for the
        unfused gate_up output stored in ``act_dtype``.
    """
    inter = w13.shape[1] // 2
    h8 = torch.empty(align.max_rows, inter, dtype=FP8, device=xq.device)
    hs = torch.empty(align.max_rows, inter // 128, dtype=torch.float32, device=xq.device)
    _launch(xq, xs, w13, w13_scale, h8, hs, None, align, cfg, True, limit, act_dtype)
    return h8, hs


def grouped_down(h8: torch.Tensor, hs: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                 route_w: torch.Tensor, align: AlignedPairs, cfg: GroupedConfig,
                 out_dtype: torch.dtype) -> torch.Tensor:
    """down GEMM of the aligned rows, times the routing weight, scattered to pair rows.

    Args:
        h8: [max_rows, I] E4M3 (contiguous), hs [max_rows, I/128].  w2: [E, D, I] E4M3,
        w2_scale [E, D/128, I/128].  route_w: [T, A].
    Returns:
        [T * A, D] in ``out_dtype`` (row ``t * A + a``; skipped pairs' rows unwritten).
    """
    out = torch.empty(align.num_pairs, w2.shape[1], dtype=out_dtype, device=h8.device)
    _launch(h8, hs, w2, w2_scale, out, None, route_w.reshape(-1).float(), align, cfg, False,
            0.0, out_dtype)
    return out
