"""Absorbed sparse MLA Partial kernels, third generation (TileLang, SM90): one producer
warpgroup that gathers (and dequantises) rows for consumer warpgroups that only compute.

Same contract as the earlier generations (``sparse_mla_tilelang.partial_program``: one CTA per
(head group, query row, KV split), outputs normalised per split with a base-2 LSE, an empty split
writes O = 0 and LSE = -2^30), so the Combine kernel, the references and the tests are shared.

The producer (the CTA's last warpgroup, 128 threads) walks the split's 64-column tiles and fills
a ring of ``stages`` bf16 tiles in shared memory, signalling ``k_ready[s]`` on an mbarrier and
waiting for ``k_free[s]`` before it refills a stage. 8 threads share a row (16 B each, a full
128 B line per instruction), 16 rows per pass.

- bf16 rows: ``cp.async`` straight into the stage (zero-filled for -1 slots), completion
  tracked by ``cp.async.mbarrier.arrive.noinc``: nothing passes through registers, so every
  stage but the one being computed is in flight.
- FP8 rows (raw e4m3, or the 528 B layout with one fp32 scale per 128 channels): 16 B chunks
  are loaded into registers (``ws1c``: the whole 64-row tile, 16 loads = 32 KB in flight; ``wspv``,
  whose producer has 96 registers: two 16-row passes for raw rows, pass r loading while pass r - 1
  is widened, one pass for the 528 B rows),
  then widened to bf16 (times the chunk's scale) and stored. The dequantisation thus runs
  on the producer's issue slots while the consumers' MMAs run; the consumers never see FP8 (both
  GEMMs stay bf16 x bf16 -> fp32, the reference's numerics). FP8 wgmma would need a K-major V
  (the SM90 PV pitfall, TileLang PR #3224) and FP8 queries (a larger error): not used.

Consumers:

``ws1c`` (16 heads per CTA, 256 threads): ONE consumer warpgroup (mma.sync, M = 16) runs the
  whole online softmax. One consumer only: TileLang lowers a cross-warp row reduction with fixed
  named barriers, and two consumer warpgroups reducing at once would meet at the same ids (why
  the round-2 16-head ws kernel was removed); the producer does no reductions. With 256 threads
  per CTA no ``setmaxnreg`` is needed (255 registers per thread are available). ``qk_chunks`` = 4
  splits S = Q K^T into four 128-channel GEMMs with their own accumulators (four short MMA
  dependency chains instead of one of 32 steps), summed after.
``wspv`` (64 heads per CTA, 384 threads; wgmma, M = 64): consumer 0 computes S = Q K^T, the
  online softmax, writes P (bf16) and its alpha to shared memory and accumulates the left half
  of O; consumer 1 waits for P and accumulates the right half (O is 64 x 512 fp32: too many
  registers for one warpgroup). This is the schedule of FlashMLA's sparse prefill and of
  TileLang's ``sparse_mla_fwd_pipelined`` example (written here for our layouts, FP8 producer,
  splits and Combine); the round-2 "seesaw" (both consumers computing S on alternate tiles and
  swapping maxima) reached only 195 TF/s on H200.

The tile loop is unrolled by ``stages`` so that every stage index is static; the split's tile
count is rounded up to a multiple of ``stages`` and the extra tiles are marked invalid (zero
rows, all scores -inf: they change nothing).

What this module does not know: the dispatch rule (``dispatch.choose_block``), the launchers and
Combine (``sparse_mla_tilelang``), how indices were chosen, or where slots come from.
"""

# NOTE: no `from __future__ import annotations`: TileLang evaluates the PrimFunc's tensor
# annotations, which name the dynamic sizes of the enclosing function.
import tilelang.language as T

from glmlab.kernels.dsa.layout import KVFormat, MlaKVLayout

EMPTY_LSE = -(2.0**30)
ACC = "float32"
# wspv register budgets after setmaxnreg (consumer 0, consumer 1, producer). A 384-thread CTA
# launches with 168 registers per thread; setmaxnreg.inc only takes what the other warpgroups
# gave back, so 128 * (c0 + c1 + p) must not exceed 384 * 168 = 64512 (round 1's hang).
LAUNCH_REGS_384 = 168
# Consumer 0 spills below 240 and consumer 1 below 168 (ptxas, sm_90a); the FP8 producer then has
# 96 registers, so in ``wspv`` it keeps two 16-row passes (8 x 16 B loads) in flight, where
# ``ws1c`` (256 threads, 255 registers each, no setmaxnreg) keeps the whole 64-row tile in flight.
REGS_WSPV = {fmt: (240, 168, 96) for fmt in KVFormat}
# two passes in flight for raw rows; the 528 B rows' scales spill then, so one pass
WSPV_FP8_BATCH = {KVFormat.BF16: 0, KVFormat.FP8_RAW: 1, KVFormat.FP8_SCALED: 0}
for _regs in REGS_WSPV.values():
    assert 128 * sum(_regs) <= 384 * LAUNCH_REGS_384 and all(r % 8 == 0 for r in _regs)


def supports(layout: MlaKVLayout) -> bool:
    """Whole 128-channel chunks per producer thread group (and one scale per chunk)."""
    return layout.rank % 128 == 0 and (layout.format is not KVFormat.FP8_SCALED
                                       or layout.group == 128)


def ws1c_builds(layout: MlaKVLayout, stages: int, qk_chunks: int) -> bool:
    """TileLang 0.1.15 refuses one ws1c form: FP8 rows with 2 stages and one QK GEMM ("[ThreadSync]
    Cannot lower a required shared-memory sync inside a divergent region with 4 participating
    threads"; 3 stages, or 4 QK chunks, lower). Benchmarks and tests skip it."""
    return supports(layout) and not (layout.format is not KVFormat.BF16 and stages == 2
                                     and qk_chunks == 1)


def _kv_dtype(fmt: KVFormat) -> str:
    return "bfloat16" if fmt is KVFormat.BF16 else "float8_e4m3"


def _signature(layout: MlaKVLayout, body):
    """Wrap ``body(Q, KV, KVS, Idx, PO, PL, width, splits)`` in the layout's PrimFunc."""
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


def _producer(layout: MlaKVLayout, BI: int, S: int, base: int, batch: int):
    """The producer macro: fills ``kv_s[stage]`` (bf16 [S, BI, R]) for tiles of one split.

    Threads ``base .. base + 127``; tile ``first + it * S + st`` goes to stage ``st``; a tile at or
    past ``last`` (or a column past ``width``) is invalid (zero rows, ``valid`` False). FP8 rows:
    ``batch`` = BI // 16 loads the whole tile before widening it (``raw`` [BI // 16, ...]);
    ``batch`` = 1 keeps two 16-row passes in flight (``raw`` [2, ...]); 0 one pass.
    """
    if batch not in (0, 1, BI // 16):
        raise ValueError(f"producer batch {batch}: 0, 1 or {BI // 16}")
    R, fmt = layout.rank, layout.format
    scale_col = layout.scale_offset // 4
    passes, groups = BI // 16, R // 128

    @T.macro
    def load_pass(KV, KVS, Idx, valid, raw, scl, p, st, r, buf, tile, row, last, width):
        # NOTE: the slot goes through a one-element register buffer: a plain name bound in a
        # macro is substituted as an expression at every use (one index load per use)
        j = r * 16 + p // 8
        col = tile * BI + j
        slot_l = T.alloc_local([1], "int32")
        slot_l[0] = T.if_then_else((col < width) & (tile < last),
                                   Idx[row, T.min(col, width - 1)], -1)
        if p % 8 == 0:
            valid[st, j] = slot_l[0] >= 0
        for u in T.unroll(groups):
            for v in T.vectorized(16):
                raw[buf, u, v] = KV[T.max(slot_l[0], 0), 128 * u + p % 8 * 16 + v]
            if fmt is KVFormat.FP8_SCALED:
                scl[buf, u] = T.if_then_else(slot_l[0] >= 0,
                                             KVS[T.max(slot_l[0], 0), scale_col + u], 0.0)
            else:
                scl[buf, u] = T.if_then_else(slot_l[0] >= 0, 1.0, 0.0)

    @T.macro
    def store_pass(kv_s, raw, scl, p, st, r, buf):
        for u in T.unroll(groups):
            for v in T.vectorized(16):
                kv_s[st, r * 16 + p // 8, 128 * u + p % 8 * 16 + v] = T.cast(
                    T.cast(raw[buf, u, v], ACC) * scl[buf, u], "bfloat16")

    @T.macro
    def produce(KV, KVS, Idx, kv_s, valid, k_ready, k_free, row, first, last, rounds, width,
                raw, scl):
        p = T.get_thread_binding() - base
        for it in T.serial(rounds):
            for st in T.unroll(S):
                T.barrier_wait(k_free[st], (it & 1) ^ 1)
                tile = first + it * S + st
                if fmt is KVFormat.BF16:
                    for r in T.unroll(passes):
                        j = r * 16 + p // 8
                        col = tile * BI + j
                        slot = T.if_then_else((col < width) & (tile < last),
                                              Idx[row, T.min(col, width - 1)], -1)
                        if p % 8 == 0:
                            valid[st, j] = slot >= 0
                        for u in T.unroll(R // 64):
                            T.ptx_cp_async(
                                T.access_ptr(kv_s[st, j, 64 * u + p % 8 * 8], "w", 8),
                                T.access_ptr(KV[T.max(slot, 0), 64 * u + p % 8 * 8], "r", 8),
                                8, slot >= 0)
                    T.cp_async_barrier_noinc(k_ready[st])
                else:
                    if batch == 0:
                        # one pass in flight: load pass r, widen it, then the next
                        for r in T.unroll(passes):
                            load_pass(KV, KVS, Idx, valid, raw, scl, p, st, r, 0, tile, row,
                                      last, width)
                            store_pass(kv_s, raw, scl, p, st, r, 0)
                    elif batch == passes:
                        # every load of the tile first (16 x 16 B per thread: 32 KB in flight),
                        # then widen and store them
                        for r in T.unroll(passes):
                            load_pass(KV, KVS, Idx, valid, raw, scl, p, st, r, r, tile, row,
                                      last, width)
                        for r in T.unroll(passes):
                            store_pass(kv_s, raw, scl, p, st, r, r)
                    else:
                        # two passes in flight: load pass r, then widen pass r - 1 (the loads
                        # of pass r are outstanding meanwhile); buffers alternate
                        for r in T.unroll(passes + 1):
                            if r < passes:
                                load_pass(KV, KVS, Idx, valid, raw, scl, p, st, r, r % 2, tile,
                                          row, last, width)
                            if r > 0:
                                store_pass(kv_s, raw, scl, p, st, r - 1, (r - 1) % 2)
                    T.fence_proxy_async()  # generic-proxy stores, read by wgmma (async proxy)
                    T.barrier_arrive(k_ready[st])

    return produce


def _split_range(width, splits, sp, BI, S):
    num_tiles = T.ceildiv(width, BI)
    per_split = T.ceildiv(num_tiles, splits)
    first = sp * per_split
    last = T.min(first + per_split, num_tiles)
    rounds = T.ceildiv(T.max(last - first, 0), S)
    return first, last, rounds


# ------------------------------------------------------------------ 16 heads: one consumer
def ws1c_program(layout: MlaKVLayout, block_i: int = 64, stages: int = 2, qk_chunks: int = 1):
    """16-head Partial: producer warpgroup + one mma.sync consumer warpgroup (256 threads)."""
    if not supports(layout) or block_i % 16 or stages not in (2, 3, 4) or qk_chunks not in (1, 4):
        raise ValueError(f"ws1c kernel: unsupported {layout} / block {block_i} / {stages} stages "
                         f"/ {qk_chunks} QK chunks")
    R, BI, HB, S = layout.rank, block_i, 16, stages
    CH = R // qk_chunks
    produce = _producer(layout, BI, S, 128, BI // 16)
    fp8 = layout.format is not KVFormat.BF16

    @T.macro
    def body(Q, KV, KVS, Idx, PO, PL, width, splits):
        heads, rows = Q.shape[1], Q.shape[0]
        with T.Kernel(T.ceildiv(heads, HB), rows, splits, threads=256) as (bh, row, sp):
            q_s = T.alloc_shared([HB, R], "bfloat16")
            kv_s = T.alloc_shared([S, BI, R], "bfloat16")
            p_s = T.alloc_shared([HB, BI], "bfloat16")
            valid = T.alloc_shared([S, BI], "bool", scope="shared")
            k_ready = T.alloc_barrier(arrive_count=[128] * S)
            k_free = T.alloc_barrier(arrive_count=[128] * S)
            tx = T.get_thread_binding()
            first, last, rounds = _split_range(width, splits, sp, BI, S)
            h0 = bh * HB
            T.copy(Q[row, h0:h0 + HB, :], q_s)
            if tx >= 128:
                raw = T.alloc_local([BI // 16, R // 128, 16], "float8_e4m3") if fp8 else None
                scl = T.alloc_local([BI // 16, R // 128], ACC) if fp8 else None
                produce(KV, KVS, Idx, kv_s, valid, k_ready, k_free, row, first, last, rounds,
                        width, raw, scl)
            else:
                acc_s = T.alloc_fragment([HB, BI], ACC)
                acc_o = T.alloc_fragment([HB, R], ACC)
                m = T.alloc_fragment([HB], ACC)
                m_prev = T.alloc_fragment([HB], ACC)
                alpha = T.alloc_fragment([HB], ACC)
                rsum = T.alloc_fragment([HB], ACC)
                l_tile = T.alloc_fragment([HB], ACC)
                if qk_chunks == 4:
                    part1 = T.alloc_fragment([HB, BI], ACC)
                    part2 = T.alloc_fragment([HB, BI], ACC)
                    part3 = T.alloc_fragment([HB, BI], ACC)
                T.fill(acc_o, 0)
                T.fill(rsum, 0)
                T.fill(m, EMPTY_LSE)
                for it in T.serial(rounds):
                    for st in T.unroll(S):
                        T.barrier_wait(k_ready[st], it & 1)
                        if qk_chunks == 1:
                            T.gemm(q_s, kv_s[st, :, :], acc_s, transpose_B=True,
                                   clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                        else:
                            T.gemm(q_s[:, 0:CH], kv_s[st, :, 0:CH], acc_s, transpose_B=True,
                                   clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                            T.gemm(q_s[:, CH:2 * CH], kv_s[st, :, CH:2 * CH], part1,
                                   transpose_B=True, clear_accum=True,
                                   policy=T.GemmWarpPolicy.FullCol)
                            T.gemm(q_s[:, 2 * CH:3 * CH], kv_s[st, :, 2 * CH:3 * CH], part2,
                                   transpose_B=True, clear_accum=True,
                                   policy=T.GemmWarpPolicy.FullCol)
                            T.gemm(q_s[:, 3 * CH:R], kv_s[st, :, 3 * CH:R], part3,
                                   transpose_B=True, clear_accum=True,
                                   policy=T.GemmWarpPolicy.FullCol)
                            for h, i in T.Parallel(HB, BI):
                                acc_s[h, i] = (acc_s[h, i] + part1[h, i]) + (part2[h, i]
                                                                             + part3[h, i])
                        for h, i in T.Parallel(HB, BI):
                            acc_s[h, i] = T.if_then_else(valid[st, i], acc_s[h, i],
                                                         -T.infinity(ACC))
                        T.copy(m, m_prev)
                        T.reduce_max(acc_s, m, dim=1, clear=False)
                        for h in T.Parallel(HB):
                            alpha[h] = T.exp2(m_prev[h] - m[h])
                        for h, i in T.Parallel(HB, BI):
                            acc_s[h, i] = T.exp2(acc_s[h, i] - m[h])
                        T.reduce_sum(acc_s, l_tile, dim=1)
                        for h in T.Parallel(HB):
                            rsum[h] = rsum[h] * alpha[h] + l_tile[h]
                        for h, d in T.Parallel(HB, R):
                            acc_o[h, d] *= alpha[h]
                        T.copy(acc_s, p_s)
                        T.gemm(p_s, kv_s[st, :, :], acc_o, policy=T.GemmWarpPolicy.FullCol)
                        T.barrier_arrive(k_free[st])
                for h, d in T.Parallel(HB, R):
                    acc_o[h, d] = acc_o[h, d] / T.if_then_else(rsum[h] == 0.0, 1.0, rsum[h])
                for h in T.Parallel(HB):
                    rsum[h] = T.if_then_else(rsum[h] == 0.0, EMPTY_LSE, T.log2(rsum[h]) + m[h])
                T.copy(acc_o, PO[row, sp, h0:h0 + HB, :])
                T.copy(rsum, PL[row, sp, h0:h0 + HB])

    return _signature(layout, body)


# ------------------------------------------------------------------ 64 heads: PV split
def wspv_program(layout: MlaKVLayout, block_i: int = 64):
    """64-head Partial: producer + consumer 0 (S, softmax, left half of O) + consumer 1 (right
    half of O), 384 threads, two bf16 stages."""
    if not supports(layout) or block_i != 64:
        raise ValueError(f"wspv kernel: unsupported {layout} / block {block_i}")
    R, BI, HB, S = layout.rank, block_i, 64, 2
    RH = R // 2
    produce = _producer(layout, BI, S, 256, WSPV_FP8_BATCH[layout.format])
    fp8 = layout.format is not KVFormat.BF16
    regs0, regs1, regs_p = REGS_WSPV[layout.format]

    @T.macro
    def body(Q, KV, KVS, Idx, PO, PL, width, splits):
        heads, rows = Q.shape[1], Q.shape[0]
        with T.Kernel(T.ceildiv(heads, HB), rows, splits, threads=384) as (bh, row, sp):
            q_s = T.alloc_shared([HB, R], "bfloat16")
            kv_s = T.alloc_shared([S, BI, R], "bfloat16")
            p_s = T.alloc_shared([HB, BI], "bfloat16")
            valid = T.alloc_shared([S, BI], "bool", scope="shared")
            alpha_s = T.alloc_shared([HB], ACC)
            sum_s = T.alloc_shared([HB], ACC)
            k_ready = T.alloc_barrier(arrive_count=[128] * S)
            k_free = T.alloc_barrier(arrive_count=[256] * S)
            p_ready = T.alloc_barrier(arrive_count=128)
            p_free = T.alloc_barrier(arrive_count=128)
            fin = T.alloc_barrier(arrive_count=128)
            tx = T.get_thread_binding()
            first, last, rounds = _split_range(width, splits, sp, BI, S)
            h0 = bh * HB
            T.copy(Q[row, h0:h0 + HB, :], q_s)
            if tx >= 256:
                T.set_max_nreg(regs_p, 0)
                raw = T.alloc_local([2, R // 128, 16], "float8_e4m3") if fp8 else None
                scl = T.alloc_local([2, R // 128], ACC) if fp8 else None
                produce(KV, KVS, Idx, kv_s, valid, k_ready, k_free, row, first, last, rounds,
                        width, raw, scl)
            elif tx < 128:
                T.set_max_nreg(regs0, 1)
                acc_s = T.alloc_fragment([HB, BI], ACC)
                acc_o = T.alloc_fragment([HB, RH], ACC)
                m = T.alloc_fragment([HB], ACC)
                m_prev = T.alloc_fragment([HB], ACC)
                alpha = T.alloc_fragment([HB], ACC)
                rsum = T.alloc_fragment([HB], ACC)
                l_tile = T.alloc_fragment([HB], ACC)
                T.fill(acc_o, 0)
                T.fill(rsum, 0)
                T.fill(m, EMPTY_LSE)
                for it in T.serial(rounds):
                    for st in T.unroll(S):
                        T.barrier_wait(k_ready[st], it & 1)
                        T.gemm(q_s, kv_s[st, :, :], acc_s, transpose_B=True, clear_accum=True)
                        for h, i in T.Parallel(HB, BI):
                            acc_s[h, i] = T.if_then_else(valid[st, i], acc_s[h, i],
                                                         -T.infinity(ACC))
                        T.copy(m, m_prev)
                        T.reduce_max(acc_s, m, dim=1, clear=False)
                        for h in T.Parallel(HB):
                            alpha[h] = T.exp2(m_prev[h] - m[h])
                        for h, i in T.Parallel(HB, BI):
                            acc_s[h, i] = T.exp2(acc_s[h, i] - m[h])
                        T.reduce_sum(acc_s, l_tile, dim=1)
                        for h in T.Parallel(HB):
                            rsum[h] = rsum[h] * alpha[h] + l_tile[h]
                        for h, d in T.Parallel(HB, RH):
                            acc_o[h, d] *= alpha[h]
                        # NOTE: consumer 1 must have read the previous P and alpha
                        T.barrier_wait(p_free, ((it * S + st) & 1) ^ 1)
                        T.copy(acc_s, p_s)
                        T.copy(alpha, alpha_s)
                        T.fence_proxy_async()  # P is read by consumer 1's wgmma
                        T.barrier_arrive(p_ready)
                        T.gemm(p_s, kv_s[st, :, 0:RH], acc_o)
                        T.barrier_arrive(k_free[st])
                T.copy(rsum, sum_s)
                T.barrier_arrive(fin)
                for h, d in T.Parallel(HB, RH):
                    acc_o[h, d] = acc_o[h, d] / T.if_then_else(rsum[h] == 0.0, 1.0, rsum[h])
                for h in T.Parallel(HB):
                    rsum[h] = T.if_then_else(rsum[h] == 0.0, EMPTY_LSE, T.log2(rsum[h]) + m[h])
                T.copy(acc_o, PO[row, sp, h0:h0 + HB, 0:RH])
                T.copy(rsum, PL[row, sp, h0:h0 + HB])
            else:
                T.set_max_nreg(regs1, 1)
                acc_o1 = T.alloc_fragment([HB, RH], ACC)
                den = T.alloc_fragment([HB], ACC)
                T.fill(acc_o1, 0)
                for it in T.serial(rounds):
                    for st in T.unroll(S):
                        T.barrier_wait(p_ready, (it * S + st) & 1)
                        T.fence_proxy_async()  # the producer's rows, read by this wgmma
                        for h, d in T.Parallel(HB, RH):
                            acc_o1[h, d] *= alpha_s[h]
                        T.gemm(p_s, kv_s[st, :, RH:R], acc_o1)
                        T.barrier_arrive(p_free)
                        T.barrier_arrive(k_free[st])
                T.barrier_wait(fin, 0)
                T.copy(sum_s, den)
                for h, d in T.Parallel(HB, RH):
                    acc_o1[h, d] = acc_o1[h, d] / T.if_then_else(den[h] == 0.0, 1.0, den[h])
                T.copy(acc_o1, PO[row, sp, h0:h0 + HB, RH:R])

    return _signature(layout, body)
