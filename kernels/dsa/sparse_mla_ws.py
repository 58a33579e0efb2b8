"""Absorbed sparse MLA Partial kernels, second generation (TileLang, SM90): pipelined gathers.

Same contract as the first generation (``sparse_mla_tilelang.partial_program``: one CTA per (head
group, query row, KV split), outputs normalised per split with a base-2 LSE, an empty split writes
O = 0 and LSE = -2^30), so the Combine kernel, the references and the tests are shared. What
changes is the schedule inside a CTA:

``ws`` (warp-specialised, 384 threads = three warpgroups):
  - warpgroup 2 is the producer: for each 64-column tile it reads the slot indices, gathers the
    latent rows into one of two shared-memory stages and signals ``k_ready[stage]`` on an
    mbarrier. bf16 rows move with ``cp.async`` (16 B per thread, zero-filled for -1 slots);
    FP8 rows are loaded 16 B at a time into registers, widened to bf16 (times the row's fp32
    scale for the 528 B layout) and stored, so dequantisation runs on the producer's cores while
    the consumers' MMAs run (FlashMLA's reason for its crossover: dequant costs more cycles than
    the MMA of one token).
  - 64-head CTAs (wgmma, M = 64): the "seesaw" schedule of FlashMLA's dense decode kernel. Two
    consumer warpgroups each own one stage of a tile pair and one half of the output columns
    (O is 64 x 512 fp32: too many registers for one warpgroup). Each computes S = Q K^T for its
    own tile, they swap row maxima through shared memory (so both use the same running max),
    each writes its P to shared memory, and each accumulates P_own V_own[half] + P_peer
    V_peer[half]. Work per warpgroup is equal; the row sums are added at the end.
  - 16-head CTAs have no ws form. Their MMAs are mma.sync (M = 16) over four warps, so every
    row max and row sum is a cross-warp reduction, and TileLang 0.1.15 lowers each one with the
    fixed named barriers 1 and 2 (``tl::AllReduce<..., NamedBarrier<128>>``). Two consumer
    warpgroups reducing at once would meet at the same barrier ids and mix their warps (a race,
    and a deadlock once one side waits on an mbarrier). The seesaw's wgmma rows stay inside one
    warp (shuffles only), so it has no such barrier.
``pipelined`` (128 or 256 threads): TileLang's software pipeline (``T.Pipelined``) over the tile
  loop; the gather is a plain copy, so TileLang issues it as ``cp.async`` ``stages - 1`` tiles
  ahead. bf16 rows only. 16-head CTAs may run 256 threads (eight warps issue the gather and
  split the PV columns; SGLang's bf16 kernel runs this shape with 256).

The tile loop walks the split's tiles in pairs (stage 0, stage 1); an odd count leaves the last
stage-1 tile past the split, which the producer marks invalid (all scores -inf, zero rows).

What this module does not know: the dispatch rule (``dispatch.choose_block``), the launchers and
Combine (``sparse_mla_tilelang``), how indices were chosen, or where slots come from.
"""

# NOTE: no `from __future__ import annotations`: TileLang evaluates the PrimFunc's tensor
# annotations, which name the dynamic sizes of the enclosing function.
import tilelang.language as T

from glmlab.kernels.dsa.layout import KVFormat, MlaKVLayout

EMPTY_LSE = -(2.0**30)
ACC = "float32"
# Register budgets per thread after ``setmaxnreg`` (producer, each consumer). A 384-thread CTA
# launches with 168 registers per thread (65536 / 384, rounded down to 8), and setmaxnreg.inc
# only takes registers that the CTA's own warpgroups gave back with setmaxnreg.dec: so
# 128 * producer + 256 * consumer must not exceed 384 * 168 = 64512, or the consumers' inc
# waits forever (round 1 asked for 80 + 2 x 216 = 65536 registers: both ws kernels hung).
LAUNCH_REGS = 168
REGS_BF16 = (40, 232)  # cp.async producer needs only addresses and a predicate
REGS_FP8 = (72, 216)  # the FP8 producer holds 16 widened values + scale per chunk
for _p, _c in (REGS_BF16, REGS_FP8):
    assert 128 * _p + 256 * _c <= 384 * LAUNCH_REGS and _p % 8 == 0 and _c % 8 == 0


def supports(layout: MlaKVLayout) -> bool:
    """The second-generation kernels need whole 128-channel chunks per producer thread group."""
    return layout.rank % 128 == 0 and (layout.format is not KVFormat.FP8_SCALED
                                       or layout.group == 128)


def _kv_dtype(fmt: KVFormat) -> str:
    return "bfloat16" if fmt is KVFormat.BF16 else "float8_e4m3"


def _signature(layout: MlaKVLayout, body):
    """Wrap ``body(Q, KV, KVS, Idx, PO, PL)`` in the PrimFunc signature of the layout."""
    R, width_row = layout.rank, layout.row_width
    rows, heads, width = T.dynamic("rows"), T.dynamic("heads"), T.dynamic("width")
    slots, splits = T.dynamic("slots"), T.dynamic("splits")
    kv_dtype = _kv_dtype(layout.format)
    if layout.format is KVFormat.FP8_SCALED:
        @T.prim_func
        def sparse_mla_partial(Q: T.Tensor([rows, heads, R], "bfloat16"),
                               KV: T.Tensor([slots, width_row], kv_dtype),
                               KVS: T.Tensor([slots, width_row // 4], ACC),
                               Idx: T.Tensor([rows, width], "int32"),
                               PO: T.Tensor([rows, splits, heads, R], ACC),
                               PL: T.Tensor([rows, splits, heads], ACC)):
            body(Q, KV, KVS, Idx, PO, PL, width, splits)
    else:
        @T.prim_func
        def sparse_mla_partial(Q: T.Tensor([rows, heads, R], "bfloat16"),
                               KV: T.Tensor([slots, width_row], kv_dtype),
                               Idx: T.Tensor([rows, width], "int32"),
                               PO: T.Tensor([rows, splits, heads, R], ACC),
                               PL: T.Tensor([rows, splits, heads], ACC)):
            body(Q, KV, None, Idx, PO, PL, width, splits)
    return sparse_mla_partial


# ------------------------------------------------------------------------------ warp-specialised
def ws_program(layout: MlaKVLayout, block_i: int = 64, heads_per_cta: int = 64):
    """The warp-specialised Partial kernel (384 threads) as a TileLang PrimFunc."""
    if not supports(layout) or block_i % 16 or heads_per_cta != 64:
        raise ValueError(f"ws kernel: unsupported {layout} / block {block_i} / "
                         f"{heads_per_cta} heads (64-head CTAs only: see the module notes)")
    R, BI, HB = layout.rank, block_i, heads_per_cta
    RH = R // 2
    fmt = layout.format
    scale_col = layout.scale_offset // 4
    free_count = 256  # both consumers read each stage
    regs_producer, regs_consumer = REGS_BF16 if fmt is KVFormat.BF16 else REGS_FP8

    @T.macro
    def produce(KV, KVS, Idx, kv_s, valid, k_ready, k_free, row, first, last, pairs, width):
        p = T.get_thread_binding() - 256
        for it in T.serial(pairs):
            for st in T.unroll(2):
                T.barrier_wait(k_free[st], (it & 1) ^ 1)
                tile = first + it * 2 + st
                for r in T.unroll(BI // 16):
                    j = r * 16 + p // 8  # 8 threads per row, 16 rows per pass
                    col = tile * BI + j
                    slot = T.if_then_else((col < width) & (tile < last),
                                          Idx[row, T.min(col, width - 1)], -1)
                    valid[st, j] = slot >= 0
                    if fmt is KVFormat.BF16:
                        for u in T.unroll(R // 64):
                            T.ptx_cp_async(
                                T.access_ptr(kv_s[st, j, 64 * u + p % 8 * 8], "w", 8),
                                T.access_ptr(KV[T.max(slot, 0), 64 * u + p % 8 * 8], "r", 8),
                                8, slot >= 0)
                    elif fmt is KVFormat.FP8_RAW:
                        # 8 B per thread and pass (the 16 B form trips TileLang's sync planner
                        # in the 16-head kernel)
                        for u in T.unroll(R // 64):
                            for v in T.vectorized(8):
                                kv_s[st, j, 64 * u + p % 8 * 8 + v] = T.if_then_else(
                                    slot >= 0,
                                    T.cast(KV[T.max(slot, 0), 64 * u + p % 8 * 8 + v],
                                           "bfloat16"), T.cast(0, "bfloat16"))
                    else:
                        for u in T.unroll(R // 128):
                            for v in T.vectorized(16):
                                kv_s[st, j, 128 * u + p % 8 * 16 + v] = T.if_then_else(
                                    slot >= 0,
                                    T.cast(T.cast(KV[T.max(slot, 0), 128 * u + p % 8 * 16 + v],
                                                  ACC) * KVS[T.max(slot, 0), scale_col + u],
                                           "bfloat16"), T.cast(0, "bfloat16"))
                if fmt is KVFormat.BF16:
                    T.cp_async_barrier_noinc(k_ready[st])
                else:
                    T.fence_proxy_async()  # generic-proxy stores, read by wgmma (async proxy)
                    T.barrier_arrive(k_ready[st])

    @T.macro
    def seesaw_consumer(own, q_s, kv_s, p_s, valid, mx_s, sum_s, bar_q, k_ready, k_free, stats,
                        p_ready, pairs, acc_o, acc_s, m, m_prev, m_peer, rsum, l_tile,
                        PO, PL, row, sp, h0):
        peer = 1 - own
        T.fill(rsum, 0)
        T.fill(m, EMPTY_LSE)
        T.fill(acc_o, 0)
        T.barrier_wait(bar_q, 0)
        for it in T.serial(pairs):
            T.barrier_wait(k_ready[own], it & 1)
            T.fill(acc_s, 0)
            T.wgmma_gemm(q_s, kv_s[own, :, :], acc_s, transpose_B=True)
            T.copy(m, m_prev)
            T.wait_wgmma(0)
            for h, i in T.Parallel(HB, BI):
                acc_s[h, i] = T.if_then_else(valid[own, i], acc_s[h, i], -T.infinity(ACC))
            T.reduce_max(acc_s, m, dim=1, clear=False)
            # NOTE: both warpgroups must scale by the same max: swap the tile maxima first
            T.copy(m, mx_s[own, :])
            T.barrier_arrive(stats[own])
            T.barrier_wait(stats[peer], it & 1)
            T.copy(mx_s[peer, :], m_peer)
            for h in T.Parallel(HB):
                m[h] = T.max(m[h], m_peer[h])
            for h, d in T.Parallel(HB, RH):
                acc_o[h, d] *= T.exp2(m_prev[h] - m[h])
            for h in T.Parallel(HB):
                rsum[h] *= T.exp2(m_prev[h] - m[h])
            for h, i in T.Parallel(HB, BI):
                acc_s[h, i] = T.exp2(acc_s[h, i] - m[h])
            T.reduce_sum(acc_s, l_tile, dim=1)
            for h in T.Parallel(HB):
                rsum[h] += l_tile[h]
            # NOTE: the peer finished reading p_s[own] of the last pair before it signalled
            # stats[peer] above, so overwriting it now is safe
            T.copy(acc_s, p_s[own, :, :])
            T.barrier_arrive(p_ready[own])
            T.wgmma_gemm(p_s[own, :, :], kv_s[own, :, own * RH:(own + 1) * RH], acc_o)
            T.barrier_wait(p_ready[peer], it & 1)
            T.wgmma_gemm(p_s[peer, :, :], kv_s[peer, :, own * RH:(own + 1) * RH], acc_o)
            T.wait_wgmma(1)
            T.barrier_arrive(k_free[own])
            T.wait_wgmma(0)
            T.barrier_arrive(k_free[peer])
        T.copy(rsum, sum_s[own, :])
        T.barrier_arrive(stats[own])
        T.barrier_wait(stats[peer], pairs & 1)
        T.copy(sum_s[peer, :], l_tile)
        for h in T.Parallel(HB):
            rsum[h] += l_tile[h]
        for h, d in T.Parallel(HB, RH):
            acc_o[h, d] = acc_o[h, d] / T.if_then_else(rsum[h] == 0.0, 1.0, rsum[h])
        T.copy(acc_o, PO[row, sp, h0:h0 + HB, own * RH:(own + 1) * RH])
        if own == 0:
            for h in T.Parallel(HB):
                rsum[h] = T.if_then_else(rsum[h] == 0.0, EMPTY_LSE, T.log2(rsum[h]) + m[h])
            T.copy(rsum, PL[row, sp, h0:h0 + HB])

    @T.macro
    def body(Q, KV, KVS, Idx, PO, PL, width, splits):
        heads, rows = Q.shape[1], Q.shape[0]
        with T.Kernel(T.ceildiv(heads, HB), rows, splits, threads=384) as (bh, row, sp):
            q_s = T.alloc_shared([HB, R], "bfloat16")
            kv_s = T.alloc_shared([2, BI, R], "bfloat16")
            p_s = T.alloc_shared([2, HB, BI], "bfloat16")
            valid = T.alloc_shared([2, BI], "bool", scope="shared")
            mx_s = T.alloc_shared([2, HB], ACC)
            sum_s = T.alloc_shared([2, HB], ACC)
            bar_q = T.alloc_barrier(arrive_count=384)
            k_ready = T.alloc_barrier(arrive_count=[128, 128])
            k_free = T.alloc_barrier(arrive_count=[free_count, free_count])
            stats = T.alloc_barrier(arrive_count=[128, 128])
            p_ready = T.alloc_barrier(arrive_count=[128, 128])
            tx = T.get_thread_binding()
            num_tiles = T.ceildiv(width, BI)
            per_split = T.ceildiv(num_tiles, splits)
            first = sp * per_split
            last = T.min(first + per_split, num_tiles)
            pairs = T.ceildiv(T.max(last - first, 0), 2)
            h0 = bh * HB
            T.copy(Q[row, h0:h0 + HB, :], q_s)
            T.barrier_arrive(bar_q)
            acc_o0 = T.alloc_fragment([HB, RH], ACC)
            acc_o1 = T.alloc_fragment([HB, RH], ACC)
            acc_s0 = T.alloc_fragment([HB, BI], ACC)
            acc_s1 = T.alloc_fragment([HB, BI], ACC)
            m0, m1 = T.alloc_fragment([HB], ACC), T.alloc_fragment([HB], ACC)
            mp0, mp1 = T.alloc_fragment([HB], ACC), T.alloc_fragment([HB], ACC)
            mq0, mq1 = T.alloc_fragment([HB], ACC), T.alloc_fragment([HB], ACC)
            l0, l1 = T.alloc_fragment([HB], ACC), T.alloc_fragment([HB], ACC)
            lt0, lt1 = T.alloc_fragment([HB], ACC), T.alloc_fragment([HB], ACC)
            if tx >= 256:
                T.set_max_nreg(regs_producer, 0)
                produce(KV, KVS, Idx, kv_s, valid, k_ready, k_free, row, first, last, pairs,
                        width)
            elif tx < 128:
                T.set_max_nreg(regs_consumer, 1)
                seesaw_consumer(0, q_s, kv_s, p_s, valid, mx_s, sum_s, bar_q, k_ready,
                                k_free, stats, p_ready, pairs, acc_o0, acc_s0, m0, mp0, mq0,
                                l0, lt0, PO, PL, row, sp, h0)
            else:
                T.set_max_nreg(regs_consumer, 1)
                seesaw_consumer(1, q_s, kv_s, p_s, valid, mx_s, sum_s, bar_q, k_ready,
                                k_free, stats, p_ready, pairs, acc_o1, acc_s1, m1, mp1, mq1,
                                l1, lt1, PO, PL, row, sp, h0)

    return _signature(layout, body)


# ------------------------------------------------------------------------------ auto-pipelined
def pipelined_program(layout: MlaKVLayout, block_i: int = 64, heads_per_cta: int = 16,
                      stages: int = 2, threads: int | None = None):
    """The ``T.Pipelined`` Partial kernel (16 heads: 128 or 256 threads; 64 heads: 256).

    NOTE: bf16 rows only: with the FP8 staging copy + widening in the loop, TileLang 0.1.15's
    pipeline planner fails ("Downcast from tirx.Sub to ir.IntImm"); FP8 rows use ``ws``.
    """
    if not supports(layout) or layout.format is not KVFormat.BF16:
        raise ValueError(f"pipelined kernel: unsupported {layout} (bf16 rows only)")
    R, BI, HB = layout.rank, block_i, heads_per_cta
    fmt, G, NG = layout.format, layout.group, max(1, layout.num_scales)
    scale_col = layout.scale_offset // 4
    threads = threads or (256 if HB == 64 else 128)
    if threads not in (128, 256) or (HB == 64 and threads != 256):
        raise ValueError(f"pipelined kernel: {threads} threads for {HB} heads")

    @T.macro
    def body(Q, KV, KVS, Idx, PO, PL, width, splits):
        heads, rows = Q.shape[1], Q.shape[0]
        with T.Kernel(T.ceildiv(heads, HB), rows, splits, threads=threads) as (bh, row, sp):
            q_s = T.alloc_shared([HB, R], "bfloat16")
            kv_s = T.alloc_shared([BI, R], "bfloat16")
            p_s = T.alloc_shared([HB, BI], "bfloat16")
            slot = T.alloc_shared([BI], "int32")
            if fmt is not KVFormat.BF16:
                raw_s = T.alloc_shared([BI, R], "float8_e4m3")
            if fmt is KVFormat.FP8_SCALED:
                scale_s = T.alloc_shared([BI, NG], ACC)
            acc_s = T.alloc_fragment([HB, BI], ACC)
            acc_o = T.alloc_fragment([HB, R], ACC)
            m = T.alloc_fragment([HB], ACC)
            m_prev = T.alloc_fragment([HB], ACC)
            alpha = T.alloc_fragment([HB], ACC)
            total = T.alloc_fragment([HB], ACC)
            tile_sum = T.alloc_fragment([HB], ACC)
            T.fill(acc_o, 0)
            T.fill(total, 0)
            T.fill(m, EMPTY_LSE)
            h0 = bh * HB
            T.copy(Q[row, h0:h0 + HB, :], q_s)
            num_tiles = T.ceildiv(width, BI)
            per_split = T.ceildiv(num_tiles, splits)
            first = sp * per_split
            count = T.max(T.min(first + per_split, num_tiles) - first, 0)
            for t in T.Pipelined(count, num_stages=stages):
                # NOTE: the slot is read inline in each copy: a shared slot buffer written in
                # the same iteration would tie the async copy stage to a later stage
                if fmt is KVFormat.BF16:
                    for i, d in T.Parallel(BI, R):
                        kv_s[i, d] = KV[T.max(Idx[row, T.min((first + t) * BI + i, width - 1)],
                                              0), d]
                else:
                    for i, d in T.Parallel(BI, R):
                        raw_s[i, d] = KV[T.max(Idx[row, T.min((first + t) * BI + i, width - 1)],
                                               0), d]
                    if fmt is KVFormat.FP8_SCALED:
                        for i, g in T.Parallel(BI, NG):
                            scale_s[i, g] = KVS[T.max(Idx[row, T.min((first + t) * BI + i,
                                                                     width - 1)], 0),
                                                scale_col + g]
                        for i, d in T.Parallel(BI, R):
                            kv_s[i, d] = T.cast(T.cast(raw_s[i, d], ACC) * scale_s[i, d // G],
                                                "bfloat16")
                    else:
                        for i, d in T.Parallel(BI, R):
                            kv_s[i, d] = T.cast(raw_s[i, d], "bfloat16")
                for i in T.Parallel(BI):
                    col = (first + t) * BI + i
                    slot[i] = T.if_then_else(col < width, Idx[row, T.min(col, width - 1)], -1)
                T.gemm(q_s, kv_s, acc_s, transpose_B=True, clear_accum=True,
                       policy=T.GemmWarpPolicy.FullCol)
                for h, i in T.Parallel(HB, BI):
                    acc_s[h, i] = T.if_then_else(slot[i] >= 0, acc_s[h, i], -T.infinity(ACC))
                T.copy(m, m_prev)
                T.reduce_max(acc_s, m, dim=1, clear=False)
                for h in T.Parallel(HB):
                    alpha[h] = T.exp2(m_prev[h] - m[h])
                for h, i in T.Parallel(HB, BI):
                    acc_s[h, i] = T.exp2(acc_s[h, i] - m[h])
                T.reduce_sum(acc_s, tile_sum, dim=1)
                for h in T.Parallel(HB):
                    total[h] = total[h] * alpha[h] + tile_sum[h]
                for h, d in T.Parallel(HB, R):
                    acc_o[h, d] *= alpha[h]
                T.copy(acc_s, p_s)
                T.gemm(p_s, kv_s, acc_o, policy=T.GemmWarpPolicy.FullCol)
            for h, d in T.Parallel(HB, R):
                acc_o[h, d] = acc_o[h, d] / T.if_then_else(total[h] == 0.0, 1.0, total[h])
            for h in T.Parallel(HB):
                total[h] = T.if_then_else(total[h] == 0.0, EMPTY_LSE, T.log2(total[h]) + m[h])
            T.copy(acc_o, PO[row, sp, h0:h0 + HB, :])
            T.copy(total, PL[row, sp, h0:h0 + HB])

    return _signature(layout, body)
