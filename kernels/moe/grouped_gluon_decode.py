"""Warp-specialised grouped block-FP8 GEMMs of the MoE for few rows per expert (decode), Gluon.

``grouped_gluon``'s schedule with A and B swapped (C^T = W X^T): the weights are the wgmma's
M side (64-row slabs) and an expert's TOK aligned token rows its N side (TOK/2 per consumer, 8
to 32), so an expert with 1-32 rows pads to TOK, not to 64 or 128: the kernel is a weight
stream. One CTA per SM walks the tiles (TOK token rows x 128 gate_up / 256 down output
channels); partitions:

- **loader** (the default, 4 warps): per (tile, 128-wide K step), once the stage is free, TMA
  loads of the token rows [TOK, 128] and the two 128-row weight halves (gate and up rows of the
  channel block, or two adjacent 128-channel blocks for down), and the combined scales
  a_scale[token] * b_scale[half] of the TOK tokens into the stage's scale slots; ``full``
  completes on the TMA bytes + one arrive.
- **two consumer warpgroups**: warpgroup ``wg`` owns tokens ``wg * TOK/2 ...`` of the tile and all
  its channels: per K step four FP8 wgmmas (two 64-row slabs per half) into one fresh fp32 tile
  each, promoted into its accumulators with one FMA scaled per token column; then an arrive on
  ``empty``. A warpgroup whose tokens are all padding skips its MMAs.

Epilogues go through a per-warpgroup shared-memory tile [channels, tokens] re-read transposed
(token rows, 16-byte vectors): gate_up applies the clamped SwiGLU and the per-128-channel FP8
requantisation (per token: the max over the tile's 128 channels) and writes E4M3 + scales in
aligned row order; down multiplies by the routing weight and scatters to pair rows. Numerics
and contracts as ``grouped_gluon`` (its GPU tests cover both); CUDA only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from glmlab.kernels.fp8.quant_triton import INV_FP8_MAX
from glmlab.kernels.fp8.ref import FP8, FP8_MAX
from glmlab.kernels.moe.grouped_gluon import (
    _ACT,
    MAXNREG,
    SCALE_SMEM,
    _group_scale,
    _half_rows,
    _quant,
    _swiglu,
    _tile_coords,
    check_operands,
)
from glmlab.kernels.moe.routing_triton import AlignedPairs

SLAB, HALF, STEP_K = 64, 128, 128  # host-side copies
SLAB_M = gl.constexpr(SLAB)  # weight rows per wgmma (M)
HALF_N = gl.constexpr(HALF)  # weight rows per half: one scale block / quant group
BLOCK_K = gl.constexpr(STEP_K)
# epilogue tiles [channels, tokens]: plain rows, read back transposed
Q_SMEM_T = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
EPI_SMEM_T = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1,
                                                  order=[1, 0]))


@dataclass(frozen=True)
class GluonDecodeConfig:
    """One launch of the swapped kernel: token rows per tile (the alignment), stages, order."""

    tok: int = 32
    stages: int = 5
    group_m: int = 8
    consumer_regs: int = 160

    @property
    def block_m(self) -> int:
        return self.tok

    def short(self) -> str:
        return f"GLD{self.tok}s{self.stages}G{self.group_m}"

    def smem_bytes(self, up: bool) -> int:
        stage = (self.tok + 2 * HALF) * STEP_K + 2 * self.tok * 4
        epi = 2 * (HALF * (self.tok // 2) if up else 2 * HALF * (self.tok // 2) * 2)
        return self.stages * stage + epi + 2048


@gluon.jit
def _num_tiles(num_padded_ptr, N, TOK: gl.constexpr, UP: gl.constexpr):
    num_m = gl.load(num_padded_ptr) // TOK
    if UP:
        num_n = N // HALF_N
    else:
        num_n = N // (2 * HALF_N)
    return num_m, num_n


@gluon.jit
def _loader(x_desc, w_desc, x_smem, w_smem, scale_smem, full, empty, x_scale_ptr, w_scale_ptr,
            expert_ids_ptr, num_padded_ptr, N, K, w_rows_per_expert, stride_xsm, stride_wse,
            stride_wsn, TOK: gl.constexpr, UP: gl.constexpr, STAGES: gl.constexpr,
            GROUP_M: gl.constexpr):
    blk: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    nbytes: gl.constexpr = TOK * BLOCK_K + 2 * HALF_N * BLOCK_K
    num_m, num_n = _num_tiles(num_padded_ptr, N, TOK, UP)
    num_k = K // BLOCK_K
    t = gl.arange(0, TOK, layout=blk)
    it = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        expert = gl.load(expert_ids_ptr + pid_m)
        r0, r1, s0, s1 = _half_rows(expert, pid_n, N, w_rows_per_expert, UP)
        row = pid_m * TOK
        xs_ptrs = x_scale_ptr + (row + t).to(gl.int64) * stride_xsm
        ws_ptr = w_scale_ptr + expert.to(gl.int64) * stride_wse
        for kb in range(num_k):
            s = it % STAGES
            x_s = gl.load(xs_ptrs + kb)
            b0 = gl.load(ws_ptr + s0 * stride_wsn + kb)
            b1 = gl.load(ws_ptr + s1 * stride_wsn + kb)
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            bar = full.index(s)
            mbarrier.expect(bar, nbytes)
            k = kb * BLOCK_K
            tma.async_copy_global_to_shared(x_desc, [row, k], bar, x_smem.index(s))
            tma.async_copy_global_to_shared(w_desc, [r0, k], bar, w_smem.index(2 * s))
            tma.async_copy_global_to_shared(w_desc, [r1, k], bar, w_smem.index(2 * s + 1))
            scale_smem.index(2 * s).store(x_s * b0)
            scale_smem.index(2 * s + 1).store(x_s * b1)
            mbarrier.arrive(bar)
            it += 1


@gluon.jit
def _mma_promote(w_half, x_t, d, acc, sc):
    d = warpgroup_mma(w_half, x_t, d, use_acc=False, is_async=True)
    d = warpgroup_mma_wait(num_outstanding=0, deps=(d,))
    return d, acc + d * sc


@gluon.jit
def _consumer(epi_smem, x_smem, w_smem, scale_smem, full, empty, out_ptr, out_scale_ptr,
              route_w_ptr, sorted_ids_ptr, num_padded_ptr, num_pairs, N, K, limit, stride_om,
              stride_osm, WG: gl.constexpr, TOK: gl.constexpr, UP: gl.constexpr,
              PRECISE: gl.constexpr, FP8_MAX_C: gl.constexpr, INV_FP8_MAX_C: gl.constexpr,
              ACT: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    HT: gl.constexpr = TOK // 2  # tokens of this warpgroup (the wgmma N)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, HT, 32])
    tok_l: gl.constexpr = gl.SliceLayout(0, mma)
    num_m, num_n = _num_tiles(num_padded_ptr, N, TOK, UP)
    num_k = K // BLOCK_K
    zero = gl.zeros([SLAB_M, HT], gl.float32, mma)
    d = zero
    it = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        first = pid_m * TOK + WG * HT
        active = gl.load(sorted_ids_ptr + first) < num_pairs
        # acc{half}{slab}: [64 weight rows, HT tokens]
        acc00 = zero
        acc01 = zero
        acc10 = zero
        acc11 = zero
        for _kb in range(num_k):
            s = it % STAGES
            mbarrier.wait(full.index(s), (it // STAGES) & 1)
            if active:
                sc0 = gl.expand_dims(scale_smem.index(2 * s).slice(WG * HT, HT).load(tok_l), 0)
                sc1 = gl.expand_dims(scale_smem.index(2 * s + 1).slice(WG * HT, HT)
                                     .load(tok_l), 0)
                x_t = x_smem.index(s).slice(WG * HT, HT).permute((1, 0))
                w0 = w_smem.index(2 * s)
                w1 = w_smem.index(2 * s + 1)
                d, acc00 = _mma_promote(w0.slice(0, SLAB_M), x_t, d, acc00, sc0)
                d, acc01 = _mma_promote(w0.slice(SLAB_M, SLAB_M), x_t, d, acc01, sc0)
                d, acc10 = _mma_promote(w1.slice(0, SLAB_M), x_t, d, acc10, sc1)
                d = warpgroup_mma(w1.slice(SLAB_M, SLAB_M), x_t, d, use_acc=False,
                                  is_async=True)
                d = warpgroup_mma_wait(num_outstanding=0, deps=(d,))
                mbarrier.arrive(empty.index(s))
                acc11 = acc11 + d * sc1
            else:
                mbarrier.arrive(empty.index(s))
            it += 1
        if UP:  # pad rows too (zeros): every aligned row down reads is defined
            y0 = _swiglu(acc00, acc10, limit, PRECISE, ACT)  # channels 0-63 of the block
            y1 = _swiglu(acc01, acc11, limit, PRECISE, ACT)  # channels 64-127
            amax = gl.maximum(gl.max(gl.abs(y0), axis=0), gl.max(gl.abs(y1), axis=0))
            scale = _group_scale(amax, FP8_MAX_C, INV_FP8_MAX_C, PRECISE)
            scale_b = gl.expand_dims(scale, 0)
            toks = first + gl.arange(0, HT, layout=tok_l)
            gl.store(out_scale_ptr + toks.to(gl.int64) * stride_osm + pid_n, scale)
            epi_smem.slice(0, SLAB_M).store(_quant(y0, scale_b, FP8_MAX_C).to(gl.float8e4nv))
            epi_smem.slice(SLAB_M, SLAB_M).store(_quant(y1, scale_b, FP8_MAX_C)
                                                 .to(gl.float8e4nv))
            _token_rows_out(epi_smem, out_ptr, first, pid_n * HALF_N, stride_om,
                            sorted_ids_ptr, num_pairs, HT, HALF_N, 16, False)
        else:
            toks = first + gl.arange(0, HT, layout=tok_l)
            pair = gl.load(sorted_ids_ptr + toks)
            w = gl.expand_dims(gl.load(route_w_ptr + pair, mask=pair < num_pairs, other=0.0), 0)
            epi_smem.slice(0, SLAB_M).store((acc00 * w).to(epi_smem.dtype))
            epi_smem.slice(SLAB_M, SLAB_M).store((acc01 * w).to(epi_smem.dtype))
            epi_smem.slice(2 * SLAB_M, SLAB_M).store((acc10 * w).to(epi_smem.dtype))
            epi_smem.slice(3 * SLAB_M, SLAB_M).store((acc11 * w).to(epi_smem.dtype))
            _token_rows_out(epi_smem, out_ptr, first, pid_n * (2 * HALF_N), stride_om,
                            sorted_ids_ptr, num_pairs, HT, 2 * HALF_N, 8, True)


@gluon.jit
def _token_rows_out(tile_smem, out_ptr, first, col0, stride_om, sorted_ids_ptr, num_pairs,
                    HT: gl.constexpr, CH: gl.constexpr, VEC: gl.constexpr,
                    SCATTER: gl.constexpr):
    # [CH channels, HT tokens] in shared memory, read transposed -> HT token rows of CH
    # channels (aligned rows, or pair rows when SCATTER; pad slots skipped), VEC per store
    lanes_c: gl.constexpr = CH // VEC  # <= 32 for the callers' (CH, VEC)
    blk: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // lanes_c, lanes_c], [4, 1], [1, 0])
    vals = tile_smem.permute((1, 0)).load(blk)
    r = first + gl.arange(0, HT, layout=gl.SliceLayout(1, blk))
    c = col0 + gl.arange(0, CH, layout=gl.SliceLayout(0, blk))
    if SCATTER:
        pair = gl.load(sorted_ids_ptr + r)
        ok = gl.expand_dims(pair < num_pairs, 1) & gl.expand_dims(c >= 0, 0)
        ptrs = out_ptr + gl.expand_dims(pair.to(gl.int64) * stride_om, 1) + gl.expand_dims(c, 0)
        gl.store(ptrs, vals.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        ptrs = out_ptr + gl.expand_dims(r.to(gl.int64) * stride_om, 1) + gl.expand_dims(c, 0)
        gl.store(ptrs, vals.to(out_ptr.dtype.element_ty))


@gluon.jit(do_not_specialize=["num_pairs"])
def _gluon_decode_kernel(
    x_desc, w_desc, x_scale_ptr, w_scale_ptr, out_ptr, out_scale_ptr, route_w_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    num_pairs, N, K, w_rows_per_expert, limit,
    stride_xsm, stride_wse, stride_wsn, stride_om, stride_osm,
    TOK: gl.constexpr, UP: gl.constexpr, PRECISE: gl.constexpr, FP8_MAX_C: gl.constexpr,
    INV_FP8_MAX_C: gl.constexpr, ACT: gl.constexpr, STAGES: gl.constexpr,
    GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr,
):
    x_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, TOK, BLOCK_K], x_desc.layout)
    w_smem = gl.allocate_shared_memory(gl.float8e4nv, [2 * STAGES, HALF_N, BLOCK_K],
                                       w_desc.layout)
    # per consumer warpgroup: [channels, its TOK/2 tokens]
    if UP:
        epi_smem = gl.allocate_shared_memory(gl.float8e4nv, [2, HALF_N, TOK // 2], Q_SMEM_T)
    else:
        epi_smem = gl.allocate_shared_memory(gl.bfloat16, [2, 2 * HALF_N, TOK // 2], EPI_SMEM_T)
    scale_smem = gl.allocate_shared_memory(gl.float32, [2 * STAGES, TOK], SCALE_SMEM)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=2)  # the TMA bytes + the loader's scale arrive
        mbarrier.init(empty.index(i), count=2)  # one arrive per consumer warpgroup
    gl.warp_specialize([
        (_loader, (x_desc, w_desc, x_smem, w_smem, scale_smem, full, empty, x_scale_ptr,
                   w_scale_ptr, expert_ids_ptr, num_padded_ptr, N, K, w_rows_per_expert,
                   stride_xsm, stride_wse, stride_wsn, TOK, UP, STAGES, GROUP_M)),
        (_consumer, (epi_smem.index(0), x_smem, w_smem, scale_smem, full, empty, out_ptr,
                     out_scale_ptr, route_w_ptr, sorted_ids_ptr, num_padded_ptr, num_pairs, N,
                     K, limit, stride_om, stride_osm, 0, TOK, UP, PRECISE, FP8_MAX_C,
                     INV_FP8_MAX_C, ACT, STAGES, GROUP_M)),
        (_consumer, (epi_smem.index(1), x_smem, w_smem, scale_smem, full, empty, out_ptr,
                     out_scale_ptr, route_w_ptr, sorted_ids_ptr, num_padded_ptr, num_pairs, N,
                     K, limit, stride_om, stride_osm, 1, TOK, UP, PRECISE, FP8_MAX_C,
                     INV_FP8_MAX_C, ACT, STAGES, GROUP_M)),
    ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])



# ---- host side ----

def _layouts(tok: int):
    fp8 = gl.float8e4nv
    return (gl.NVMMASharedLayout.get_default_for([tok, STEP_K], fp8),
            gl.NVMMASharedLayout.get_default_for([HALF, STEP_K], fp8))


def _check(cfg: GluonDecodeConfig, align: AlignedPairs, x: torch.Tensor, w: torch.Tensor,
           w_scale, up: bool) -> None:
    if cfg.tok not in (16, 32, 64):
        raise ValueError(f"tok must be 16, 32 or 64, got {cfg.tok}")
    if align.block_m != cfg.tok:
        raise ValueError(f"pairs aligned to {align.block_m} rows, config has tok {cfg.tok}")
    check_operands(cfg, align, x, w, w_scale, up)


def _launch(x, x_scale, w, w_scale, out, out_scale, route_w, align, cfg: GluonDecodeConfig, up,
            limit, act):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    _check(cfg, align, x, w, w_scale, up)
    e, n_w, k = w.shape
    n_out = n_w // 2 if up else n_w
    x_layout, w_layout = _layouts(cfg.tok)
    x_desc = TensorDescriptor.from_tensor(x, [cfg.tok, STEP_K], x_layout)
    w_desc = TensorDescriptor.from_tensor(w.view(e * n_w, k), [HALF, STEP_K], w_layout)
    tiles = align.num_row_blocks * (n_out // (HALF if up else 2 * HALF))
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    _gluon_decode_kernel[(max(1, min(tiles, sms)),)](
        x_desc, w_desc, x_scale, w_scale, out, out_scale if up else out,
        route_w if route_w is not None else x_scale, align.sorted_ids, align.expert_ids,
        align.num_padded, align.num_pairs, n_out, k, n_w, float(limit),
        x_scale.stride(0), w_scale.stride(0), w_scale.stride(1), out.stride(0),
        out_scale.stride(0) if up else 0,
        TOK=cfg.tok, UP=up, PRECISE=True, FP8_MAX_C=FP8_MAX, INV_FP8_MAX_C=INV_FP8_MAX,
        ACT=_ACT[act], STAGES=cfg.stages, GROUP_M=cfg.group_m,
        CONSUMER_REGS=cfg.consumer_regs, num_warps=4, maxnreg=MAXNREG)


def gluon_decode_up(x8: torch.Tensor, x_scale: torch.Tensor, w13: torch.Tensor,
                    w13_scale: torch.Tensor, align: AlignedPairs, cfg: GluonDecodeConfig,
                    limit: float, act_dtype: torch.dtype = torch.bfloat16
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """gate_up GEMM (swapped) of the aligned rows with the SwiGLU + FP8 requant fused.

    Args and returns as ``grouped_gluon.gluon_up``, with pairs aligned to ``cfg.tok`` rows
    (``permute_triton.gather_quant`` at that alignment).
    """
    inter = w13.shape[1] // 2
    h8 = torch.empty(align.max_rows, inter, dtype=FP8, device=x8.device)
    hs = torch.empty(align.max_rows, inter // 128, dtype=torch.float32, device=x8.device)
    _launch(x8, x_scale, w13, w13_scale, h8, hs, None, align, cfg, True, limit, act_dtype)
    return h8, hs


def gluon_decode_down(h8: torch.Tensor, hs: torch.Tensor, w2: torch.Tensor,
                      w2_scale: torch.Tensor, route_w: torch.Tensor, align: AlignedPairs,
                      cfg: GluonDecodeConfig, out_dtype: torch.dtype) -> torch.Tensor:
    """down GEMM (swapped), times the routing weight, scattered to pair rows; as
    ``grouped_gluon.gluon_down`` with pairs aligned to ``cfg.tok`` rows."""
    out = torch.empty(align.num_pairs, w2.shape[1], dtype=out_dtype, device=h8.device)
    _launch(h8, hs, w2, w2_scale, out, None, route_w.reshape(-1).float(), align, cfg, False,
            0.0, out_dtype)
    return out
