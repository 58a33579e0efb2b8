"""Warp-specialised persistent grouped block-FP8 GEMMs of the MoE, in Gluon (Triton's explicit
layer: shared memory, mbarriers, TMA and async wgmma are written out, not inferred).

DeepGEMM's Hopper schedule in Triton's own language. One CTA per SM walks the tiles of the
device-side aligned row count (no host sync, CUDA-graph capturable) with three warp partitions:

- **producer** (1 warp, few registers): for every (tile, 128-wide K step) waits for a free
  stage, then issues four TMA loads into it -- A rows 0-63 and 64-127 of the row block, and the
  two 128-row halves of the weight tile -- completing on the stage's ``full`` mbarrier.
- **two consumer warpgroups** (4 warps each, the register budget): warpgroup ``wg`` owns rows
  ``64 * wg ...`` of the 128-row tile. Per K step it waits for ``full``, runs one FP8 wgmma
  (m64 n128 k32 x 4) per half into a fresh fp32 tile, waits for it, and promotes it into its
  running accumulator with one FMA per element scaled by ``a_scale[row] * b_scale`` (the block
  recipe: per-token-group activations, 128 x 128 weight blocks; DeepGEMM's FP32 promotion per K
  block); after the second half it arrives on the stage's ``empty`` mbarrier (count 2: both
  warpgroups). The two warpgroups synchronise only through the stage barriers, so one promotes
  while the other's wgmma runs: the tensor cores stay fed without a CTA-wide barrier per step.

Halves: gate_up (``UP``) takes the gate rows ``n0 ...`` and the matching up rows ``I + n0 ...``
of w13, and the epilogue applies the clamped SwiGLU and the per-128-channel FP8 requantisation
(``grouped_triton``'s roundings: h rounded to the activation dtype first) and writes E4M3 + fp32
scales in aligned row order; down takes two adjacent 128-column blocks (256 output columns per
tile), multiplies by the routing weight and scatters rows to pair order. A consumer whose 64
rows are all padding (the tail of an expert) skips its MMAs and writes zeros (up) / nothing
(down). Tile order: GROUP_M row blocks (consecutive experts) per column block, as in
``grouped_triton``.

Gluon has no CPU interpreter: the CPU tier compiles this for sm_90 (``aot.compile_gluon``) and
reads its SASS; numerics are checked on the GPU against ``ref.moe_experts_fp8_ref`` and the
Triton kernels (``tests/kernels/moe/test_moe_grouped_gpu.py``). Block-FP8 weights, A rows in
aligned order (``permute_triton.gather_quant`` for gate_up, the gate_up output for down).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.extra import libdevice
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from glmlab.kernels.fp8.quant_triton import INV_FP8_MAX
from glmlab.kernels.fp8.ref import FP8, FP8_MAX
from glmlab.kernels.moe.routing_triton import AlignedPairs

TILE_M, WG_M, HALF, STEP_K = 128, 64, 128, 128  # host-side copies of the tile constants
BLOCK_M = gl.constexpr(TILE_M)  # rows per tile: two consumer warpgroups x 64
SUB_M = gl.constexpr(WG_M)  # rows per consumer warpgroup (one wgmma M)
HALF_N = gl.constexpr(HALF)  # columns per half (one weight scale block, one quant group)
BLOCK_K = gl.constexpr(STEP_K)  # one K step = one FP8 scale group
SMEM_LIMIT = 227 * 1024


@dataclass(frozen=True)
class GluonConfig:
    """One launch of the warp-specialised kernel: pipeline depth, tile order, registers."""

    stages: int = 3
    group_m: int = 16
    consumer_regs: int = 216

    @property
    def block_m(self) -> int:
        return TILE_M

    def short(self) -> str:
        return f"GL{TILE_M}x2x{HALF}s{self.stages}G{self.group_m}r{self.consumer_regs}"

    def smem_bytes(self, up: bool) -> int:
        epi = 2 * WG_M * HALF * (1 if up else 2)
        return self.stages * ((TILE_M + 2 * HALF) * STEP_K + 2 * TILE_M * 4) + epi + 256


EPI_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16))
SCALE_SMEM = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
Q_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8))

# Registers: 3 warpgroups (2 consumers + the producer's) share 64K; launched at
# 65536 / 384 = 170 -> 168, then setmaxnreg moves them to the consumers.
MAXNREG = 168


@gluon.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: gl.constexpr):
    # GROUP_M row blocks (consecutive experts) per column block, row block fastest.
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % rows, (tile % per_group) // rows


@gluon.jit
def _num_tiles(num_padded_ptr, N, UP: gl.constexpr):
    num_m = gl.load(num_padded_ptr) // BLOCK_M
    if UP:
        num_n = N // HALF_N
    else:
        num_n = N // (2 * HALF_N)
    return num_m, num_n


@gluon.jit
def _half_rows(expert, pid_n, N, b_rows_per_expert, UP: gl.constexpr):
    # first weight row (of the [E * rows, K] view) of each half, and its scale-block index
    base = expert * b_rows_per_expert
    if UP:  # gate rows n0.., up rows I + n0..
        n0 = pid_n * HALF_N
        r0 = base + n0
        r1 = base + N + n0
        s0 = pid_n
        s1 = N // HALF_N + pid_n
    else:  # two adjacent 128-column blocks
        r0 = base + pid_n * (2 * HALF_N)
        r1 = r0 + HALF_N
        s0 = 2 * pid_n
        s1 = s0 + 1
    return r0, r1, s0, s1


@gluon.jit
def _loader(a_desc, b_desc, a_smem, b_smem, scale_smem, full, empty, a_scale_ptr, b_scale_ptr,
            expert_ids_ptr, num_padded_ptr, N, K, b_rows_per_expert, stride_asm, stride_bse,
            stride_bsn, UP: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    # The default partition (4 warps). Per (tile, K step), once the stage is free: one thread
    # issues the four TMA loads (A rows 0-63 / 64-127, the weight halves) completing on
    # ``full``; every thread writes a_scale[row] * b_scale[half] of its row into the stage's
    # scale slots (loaded before the wait, so their latency hides under it) and the partition
    # arrives on ``full`` once (count 2: the TMA bytes + this arrive; its release orders the
    # stores before the consumers' acquire).
    blk: gl.constexpr = gl.BlockedLayout([BLOCK_M // 128], [32], [4], [0])
    nbytes: gl.constexpr = 2 * SUB_M * BLOCK_K + 2 * HALF_N * BLOCK_K
    num_m, num_n = _num_tiles(num_padded_ptr, N, UP)
    num_k = K // BLOCK_K
    r = gl.arange(0, BLOCK_M, layout=blk)
    it = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        expert = gl.load(expert_ids_ptr + pid_m)
        r0, r1, s0, s1 = _half_rows(expert, pid_n, N, b_rows_per_expert, UP)
        row = pid_m * BLOCK_M
        as_ptrs = a_scale_ptr + (row + r).to(gl.int64) * stride_asm
        bs_ptr = b_scale_ptr + expert.to(gl.int64) * stride_bse
        for kb in range(num_k):
            s = it % STAGES
            a_s = gl.load(as_ptrs + kb)
            b0 = gl.load(bs_ptr + s0 * stride_bsn + kb)
            b1 = gl.load(bs_ptr + s1 * stride_bsn + kb)
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            bar = full.index(s)
            mbarrier.expect(bar, nbytes)
            k = kb * BLOCK_K
            tma.async_copy_global_to_shared(a_desc, [row, k], bar, a_smem.index(2 * s))
            tma.async_copy_global_to_shared(a_desc, [row + SUB_M, k], bar, a_smem.index(2 * s + 1))
            tma.async_copy_global_to_shared(b_desc, [r0, k], bar, b_smem.index(2 * s))
            tma.async_copy_global_to_shared(b_desc, [r1, k], bar, b_smem.index(2 * s + 1))
            scale_smem.index(2 * s).store(a_s * b0)
            scale_smem.index(2 * s + 1).store(a_s * b1)
            mbarrier.arrive(bar)
            it += 1


@gluon.jit
def _swiglu(gate, up, limit, PRECISE: gl.constexpr, ACT: gl.constexpr):
    # grouped_triton._swiglu_quant_tile's roundings: h in the activation dtype, torch's CUDA
    # silu (x / (1 + expf(-x))), the product rounded to the activation dtype.
    g = gl.minimum(gate.to(ACT).to(gl.float32), limit)
    u = gl.minimum(gl.maximum(up.to(ACT).to(gl.float32), -limit), limit)
    if PRECISE:
        e = libdevice.exp(-g)
    else:
        e = gl.exp(-g)
    silu = gl.div_rn(g, 1.0 + e).to(ACT).to(gl.float32)
    return (silu * u).to(ACT).to(gl.float32)


@gluon.jit
def _group_scale(amax, FP8_MAX_C: gl.constexpr, INV_FP8_MAX_C: gl.constexpr,
                 PRECISE: gl.constexpr):
    # quant_triton.group_scale: max(amax, 1e-12) / 448 as torch computes it on this device
    amax = gl.maximum(amax, 1e-12)
    if PRECISE:  # torch on CUDA: amax * fl(1/448)
        scale = amax * INV_FP8_MAX_C
    else:
        scale = gl.div_rn(amax, gl.full(amax.shape, FP8_MAX_C, gl.float32, amax.type.layout))
    return scale


@gluon.jit
def _quant(y, scale_b, FP8_MAX_C: gl.constexpr):
    # y / scale (IEEE), clamped to the E4M3 range; scale_b broadcast to y's shape
    q = gl.div_rn(y, scale_b + gl.zeros_like(y))
    return gl.minimum(gl.maximum(q, -FP8_MAX_C), FP8_MAX_C)


@gluon.jit
def _swiglu_quant(gate, up, limit, FP8_MAX_C: gl.constexpr, INV_FP8_MAX_C: gl.constexpr,
                  PRECISE: gl.constexpr, ACT: gl.constexpr):
    # [rows, 128 channels] -> (q in the E4M3 range, one scale per row)
    y = _swiglu(gate, up, limit, PRECISE, ACT)
    scale = _group_scale(gl.max(gl.abs(y), axis=1), FP8_MAX_C, INV_FP8_MAX_C, PRECISE)
    return _quant(y, gl.expand_dims(scale, 1), FP8_MAX_C), scale


@gluon.jit
def _consumer(epi_smem, a_smem, b_smem, scale_smem, full, empty, out_ptr, out_scale_ptr,
              route_w_ptr, sorted_ids_ptr, num_padded_ptr, num_pairs, N, K, limit, stride_om,
              stride_osm, WG: gl.constexpr, UP: gl.constexpr, PRECISE: gl.constexpr,
              FP8_MAX_C: gl.constexpr, INV_FP8_MAX_C: gl.constexpr, ACT: gl.constexpr,
              STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, HALF_N, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    num_m, num_n = _num_tiles(num_padded_ptr, N, UP)
    num_k = K // BLOCK_K
    zero = gl.zeros([SUB_M, HALF_N], gl.float32, mma)
    d = zero
    it = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        first = pid_m * BLOCK_M + WG * SUB_M
        rows = first + gl.arange(0, SUB_M, layout=rows_l)
        # an expert's real rows come first: a warpgroup whose first row is padding has none
        active = gl.load(sorted_ids_ptr + first) < num_pairs
        acc0 = zero
        acc1 = zero
        for _kb in range(num_k):
            s = it % STAGES
            mbarrier.wait(full.index(s), (it // STAGES) & 1)
            if active:
                # a_scale[row] * b_scale of each half, written by the loader
                sc0 = gl.expand_dims(scale_smem.index(2 * s).slice(WG * SUB_M, SUB_M)
                                     .load(rows_l), 1)
                sc1 = gl.expand_dims(scale_smem.index(2 * s + 1).slice(WG * SUB_M, SUB_M)
                                     .load(rows_l), 1)
                a = a_smem.index(2 * s + WG)
                # d: one register block reused by every MMA (use_acc=False ignores its value;
                # passing the dead tile instead of a constant keeps the wgmma's 64 output
                # registers in one place, which the allocator otherwise fragments)
                d = warpgroup_mma(a, b_smem.index(2 * s).permute((1, 0)), d, use_acc=False,
                                  is_async=True)
                d = warpgroup_mma_wait(num_outstanding=0, deps=(d,))
                acc0 = acc0 + d * sc0
                d = warpgroup_mma(a, b_smem.index(2 * s + 1).permute((1, 0)), d,
                                  use_acc=False, is_async=True)
                d = warpgroup_mma_wait(num_outstanding=0, deps=(d,))
                mbarrier.arrive(empty.index(s))
                acc1 = acc1 + d * sc1
            else:
                mbarrier.arrive(empty.index(s))
            it += 1
        # epilogue through this warpgroup's shared-memory tile: registers hold [64, 128] in
        # the wgmma layout (2 consecutive columns per thread), which as direct stores needs one
        # 64-bit address per pair of elements; re-read row-contiguous, 16-byte vectors need 8
        if UP:  # pad rows too (zeros), so every aligned row down reads is defined
            q, scale = _swiglu_quant(acc0, acc1, limit, FP8_MAX_C, INV_FP8_MAX_C, PRECISE, ACT)
            gl.store(out_scale_ptr + rows.to(gl.int64) * stride_osm + pid_n, scale)
            epi_smem.store(q.to(gl.float8e4nv))
            _rows_out(epi_smem, out_ptr, first, pid_n * HALF_N, stride_om, sorted_ids_ptr,
                      num_pairs, 16, False)
        else:  # weighted scatter to pair rows; pad slots have no destination
            pair = gl.load(sorted_ids_ptr + rows)
            w = gl.expand_dims(gl.load(route_w_ptr + pair, mask=pair < num_pairs, other=0.0), 1)
            epi_smem.store((acc0 * w).to(epi_smem.dtype))
            _rows_out(epi_smem, out_ptr, first, pid_n * (2 * HALF_N), stride_om, sorted_ids_ptr,
                      num_pairs, 8, True)
            epi_smem.store((acc1 * w).to(epi_smem.dtype))
            _rows_out(epi_smem, out_ptr, first, pid_n * (2 * HALF_N) + HALF_N, stride_om,
                      sorted_ids_ptr, num_pairs, 8, True)


@gluon.jit
def _rows_out(tile_smem, out_ptr, first, col0, stride_om, sorted_ids_ptr, num_pairs,
              VEC: gl.constexpr, SCATTER: gl.constexpr):
    # [64, 128] tile in shared memory -> out rows (aligned rows, or pair rows when SCATTER;
    # pad slots skipped), VEC elements (16 bytes) per store
    lanes_n: gl.constexpr = HALF_N // VEC
    blk: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // lanes_n, lanes_n], [4, 1], [1, 0])
    vals = tile_smem.load(blk)
    r = first + gl.arange(0, SUB_M, layout=gl.SliceLayout(1, blk))
    c = col0 + gl.arange(0, HALF_N, layout=gl.SliceLayout(0, blk))
    if SCATTER:
        pair = gl.load(sorted_ids_ptr + r)
        ok = gl.expand_dims(pair < num_pairs, 1) & gl.expand_dims(c >= 0, 0)
        ptrs = out_ptr + gl.expand_dims(pair.to(gl.int64) * stride_om, 1) + gl.expand_dims(c, 0)
        gl.store(ptrs, vals.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        ptrs = out_ptr + gl.expand_dims(r.to(gl.int64) * stride_om, 1) + gl.expand_dims(c, 0)
        gl.store(ptrs, vals.to(out_ptr.dtype.element_ty))


@gluon.jit(do_not_specialize=["num_pairs"])
def _gluon_grouped_kernel(
    a_desc, b_desc, a_scale_ptr, b_scale_ptr, out_ptr, out_scale_ptr, route_w_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    num_pairs, N, K, b_rows_per_expert, limit,
    stride_asm, stride_bse, stride_bsn, stride_om, stride_osm,
    UP: gl.constexpr, PRECISE: gl.constexpr, FP8_MAX_C: gl.constexpr,
    INV_FP8_MAX_C: gl.constexpr, ACT: gl.constexpr, STAGES: gl.constexpr,
    GROUP_M: gl.constexpr, CONSUMER_REGS: gl.constexpr,
):
    a_smem = gl.allocate_shared_memory(gl.float8e4nv, [2 * STAGES, SUB_M, BLOCK_K], a_desc.layout)
    b_smem = gl.allocate_shared_memory(gl.float8e4nv, [2 * STAGES, HALF_N, BLOCK_K],
                                       b_desc.layout)
    # one epilogue tile per consumer warpgroup: E4M3 h (gate_up) or bf16 output (down)
    if UP:
        epi_smem = gl.allocate_shared_memory(gl.float8e4nv, [2, SUB_M, HALF_N], Q_SMEM)
    else:
        epi_smem = gl.allocate_shared_memory(gl.bfloat16, [2, SUB_M, HALF_N], EPI_SMEM)
    # per stage and half: a_scale[row] * b_scale for the tile's 128 rows
    scale_smem = gl.allocate_shared_memory(gl.float32, [2 * STAGES, BLOCK_M], SCALE_SMEM)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=2)  # the TMA bytes + the scale warp
        mbarrier.init(empty.index(i), count=2)  # one arrive per consumer warpgroup
    gl.warp_specialize([
        (_loader, (a_desc, b_desc, a_smem, b_smem, scale_smem, full, empty, a_scale_ptr,
                   b_scale_ptr, expert_ids_ptr, num_padded_ptr, N, K, b_rows_per_expert,
                   stride_asm, stride_bse, stride_bsn, UP, STAGES, GROUP_M)),
        (_consumer, (epi_smem.index(0), a_smem, b_smem, scale_smem, full, empty, out_ptr,
                     out_scale_ptr, route_w_ptr, sorted_ids_ptr, num_padded_ptr, num_pairs, N,
                     K, limit, stride_om, stride_osm, 0, UP, PRECISE, FP8_MAX_C,
                     INV_FP8_MAX_C, ACT, STAGES, GROUP_M)),
        (_consumer, (epi_smem.index(1), a_smem, b_smem, scale_smem, full, empty, out_ptr,
                     out_scale_ptr, route_w_ptr, sorted_ids_ptr, num_padded_ptr, num_pairs, N,
                     K, limit, stride_om, stride_osm, 1, UP, PRECISE, FP8_MAX_C,
                     INV_FP8_MAX_C, ACT, STAGES, GROUP_M)),
    ], [4, 4], [CONSUMER_REGS, CONSUMER_REGS])


# ---- host side ----

_ACT = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}


def _layouts():
    fp8 = gl.float8e4nv
    return (gl.NVMMASharedLayout.get_default_for([WG_M, STEP_K], fp8),
            gl.NVMMASharedLayout.get_default_for([HALF, STEP_K], fp8))


def _check(cfg: GluonConfig, align: AlignedPairs, a: torch.Tensor, w: torch.Tensor, w_scale,
           up: bool) -> None:
    if align.block_m != TILE_M:
        raise ValueError(f"pairs aligned to {align.block_m} rows, the Gluon kernel takes "
                         f"{TILE_M}")
    check_operands(cfg, align, a, w, w_scale, up)


def check_operands(cfg, align: AlignedPairs, a: torch.Tensor, w: torch.Tensor, w_scale,
                   up: bool) -> None:
    """What both Gluon kernels (prefill and decode) need of their operands and their config."""
    if not a.is_cuda:
        raise ValueError("the Gluon kernel runs on CUDA devices only (no interpreter)")
    if w.dtype != FP8 or w_scale is None or a.dtype != FP8:
        raise ValueError("the Gluon kernel takes block-FP8 weights and E4M3 activations only")
    n_out = w.shape[1] // 2 if up else w.shape[1]
    step = HALF if up else 2 * HALF
    if n_out % step or w.shape[2] % STEP_K:
        raise ValueError(f"N={n_out} must be a multiple of {step} and K={w.shape[2]} of "
                         f"{STEP_K}")
    if a.shape[0] != align.max_rows or not a.is_contiguous():
        raise ValueError(f"A must hold the {align.max_rows} aligned rows (contiguous), got "
                         f"{tuple(a.shape)}")
    if cfg.smem_bytes(up) > SMEM_LIMIT:
        raise ValueError(f"{cfg.short()} needs {cfg.smem_bytes(up)} B of shared memory")


def _launch(a, a_scale, w, w_scale, out, out_scale, route_w, align, cfg: GluonConfig, up,
            limit, act):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    _check(cfg, align, a, w, w_scale, up)
    e, n_w, k = w.shape
    n_out = n_w // 2 if up else n_w
    a_layout, b_layout = _layouts()
    a_desc = TensorDescriptor.from_tensor(a, [WG_M, STEP_K], a_layout)
    b_desc = TensorDescriptor.from_tensor(w.view(e * n_w, k), [HALF, STEP_K], b_layout)
    tiles = align.num_row_blocks * (n_out // (HALF if up else 2 * HALF))
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    _gluon_grouped_kernel[(max(1, min(tiles, sms)),)](
        a_desc, b_desc, a_scale, w_scale, out, out_scale if up else out,
        route_w if route_w is not None else a_scale, align.sorted_ids, align.expert_ids,
        align.num_padded, align.num_pairs, n_out, k, n_w, float(limit),
        a_scale.stride(0), w_scale.stride(0), w_scale.stride(1), out.stride(0),
        out_scale.stride(0) if up else 0,
        UP=up, PRECISE=True, FP8_MAX_C=FP8_MAX, INV_FP8_MAX_C=INV_FP8_MAX, ACT=_ACT[act],
        STAGES=cfg.stages, GROUP_M=cfg.group_m, CONSUMER_REGS=cfg.consumer_regs,
        num_warps=4, maxnreg=MAXNREG)


def gluon_up(a8: torch.Tensor, a_scale: torch.Tensor, w13: torch.Tensor,
             w13_scale: torch.Tensor, align: AlignedPairs, cfg: GluonConfig, limit: float,
             act_dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """gate_up GEMM of the aligned rows with the clamped SwiGLU + FP8 requant fused.

    Args:
        a8: [max_rows, D] E4M3 in aligned row order (``permute_triton.gather_quant``), a_scale
            [max_rows, D/128] fp32.  w13: [E, 2I, D] E4M3 (gate rows then up rows), w13_scale
            [E, 2I/128, D/128].  align: pairs aligned to 128 rows.
    Returns:
        h8 [max_rows, I] E4M3 and hs [max_rows, I/128] fp32 in aligned row order (pad rows
        zeros; rows past ``align.num_padded`` unwritten), as ``grouped_triton.grouped_up``.
    """
    inter = w13.shape[1] // 2
    h8 = torch.empty(align.max_rows, inter, dtype=FP8, device=a8.device)
    hs = torch.empty(align.max_rows, inter // 128, dtype=torch.float32, device=a8.device)
    _launch(a8, a_scale, w13, w13_scale, h8, hs, None, align, cfg, True, limit, act_dtype)
    return h8, hs


def gluon_down(h8: torch.Tensor, hs: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
               route_w: torch.Tensor, align: AlignedPairs, cfg: GluonConfig,
               out_dtype: torch.dtype) -> torch.Tensor:
    """down GEMM of the aligned rows, times the routing weight, scattered to pair rows.

    Args:
        h8: [max_rows, I] E4M3, hs [max_rows, I/128].  w2: [E, D, I] E4M3, w2_scale
        [E, D/128, I/128].  route_w: [T, A].
    Returns:
        [T * A, D] in ``out_dtype`` (row ``t * A + a``; skipped pairs' rows unwritten).
    """
    out = torch.empty(align.num_pairs, w2.shape[1], dtype=out_dtype, device=h8.device)
    _launch(h8, hs, w2, w2_scale, out, None, route_w.reshape(-1).float(), align, cfg, False,
            0.0, out_dtype)
    return out
