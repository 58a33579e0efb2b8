"""The DFlash2 draft attention (``ref.draft_attention_ref``) read straight from the draft KV store:
flash-decoding over the context, the context K/V never gathered into a [N, L, HKV, Dh] copy.

Programs: grid (N, HKV, splits + 1). Program (n, kvh, s < splits) holds the G = H / HKV query
heads of KV head kvh for all B block rows as one M = G * B row tile (32 rows at G = 4, B = 8:
tl.dot wants M >= 16, and one tile reads each K/V row once for all G heads), walks its share
[s * chunk, (s + 1) * chunk) of request n's context in BLOCK_N-row tiles, loading each tile's K
and V rows by token slot (pointer arithmetic from the slot ids: the gather is the load itself),
and keeps an online softmax in fp32 with exp2 of log2(e)-scaled scores. The extra program
s = splits attends to the block's own B keys (non-causal: every block row sees all of them).
Each writes its normalised partial o and log2-sum-exp; ``_combine_kernel`` (grid N x HKV) merges
the splits + 1 partials into o [N, B, H, Dh] in q's dtype.

Splits: from Lmax (``ctx_slots.shape[1]``, known on the host) and the SM count, never from the
device lengths, so nothing waits on the GPU; a split beyond a request's own length runs no tiles
and leaves an empty partial (lse = -inf), which the combine weighs as zero. Lmax and the chunk are
runtime arguments: a growing context does not recompile the kernel.

FP8 draft KV (E4M3 with one fp32 scale per (slot, head)): the scale is constant along a key row,
so it multiplies the scores column-wise (k) and the probabilities column-wise (v); the E4M3 values
go into tl.dot as bf16, which holds them exactly.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from glmlab.kernels.fp8 import interpret_casts

LOG2E = 1.4426950408889634
BLOCK_N = 64  # context rows per tile: 64 x 128 bf16 K plus V is 32 KB per stage
WAVES = 8  # programs per SM the split rule aims for: enough loads in flight to cover HBM latency
MIN_SPLIT_ROWS = 256  # no split shorter than this: each one pays a partial write and a merge


@triton.jit
def _attend_tile(q, k, v, ok, k_scale, v_scale, m_i, l_i, acc, qk_scale,
                 SCALED: tl.constexpr, DOT_FP32: tl.constexpr):
    """One online-softmax step: rows of q [M, Dh] against key tile k, v [BN, Dh] (columns with
    ``ok`` False take no weight). Returns the updated (max, denominator, accumulator)."""
    if DOT_FP32:  # the CPU interpreter's bf16 dot is wrong; fp32 inputs keep fp32 on the GPU
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k.to(q.dtype)))
    s = s * qk_scale
    if SCALED:
        s = s * k_scale[None, :]
    s = tl.where(ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile has at least one ok column
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if SCALED:
        p = p * v_scale[None, :]  # the V scale belongs to the key column, not to the sum
    if DOT_FP32:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _split_kernel(q_ptr, kb_ptr, vb_ptr, kk_ptr, kv_ptr, ks_ptr, vs_ptr, slots_ptr, lens_ptr,
                  o_part_ptr, lse_part_ptr, qk_scale, B, Lmax, chunk, num_splits,
                  s_qn, s_qb, s_qh, s_kbn, s_kbb, s_kbh, s_vbn, s_vbb, s_vbh,
                  s_kks, s_kkh, s_kvs, s_kvh, s_kss, s_ksh, s_vss, s_vsh, s_slot,
                  G: tl.constexpr, DH: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, FP8: tl.constexpr,
                  DOT_FP32: tl.constexpr):
    n, kvh, sp = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    rows = tl.arange(0, BLOCK_M)
    b, head = rows // G, kvh * G + rows % G  # row r: block row r // G, query head of group r % G
    row_ok = b < B
    d = tl.arange(0, DH)
    q = tl.load(q_ptr + n * s_qn + b[:, None] * s_qb + head[:, None] * s_qh + d[None, :],
                mask=row_ok[:, None], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DH], tl.float32)
    if sp == num_splits:  # the block's own keys, in q's dtype, never scaled
        j = tl.arange(0, BLOCK_B)
        ok = j < B
        k = tl.load(kb_ptr + n * s_kbn + j[:, None] * s_kbb + kvh * s_kbh + d[None, :],
                    mask=ok[:, None], other=0.0)
        v = tl.load(vb_ptr + n * s_vbn + j[:, None] * s_vbb + kvh * s_vbh + d[None, :],
                    mask=ok[:, None], other=0.0)
        m_i, l_i, acc = _attend_tile(q, k, v, ok, qk_scale, qk_scale, m_i, l_i, acc, qk_scale,
                                     False, DOT_FP32)
    else:
        length = tl.minimum(tl.load(lens_ptr + n).to(tl.int32), Lmax)
        lo = sp * chunk
        hi = tl.minimum(lo + chunk, length)
        for start in range(lo, hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            ok = cols < hi
            # int64: slots x HKV x Dh passes 2^31 at 64K contexts of 132 requests
            slot = tl.load(slots_ptr + n * s_slot + cols, mask=ok, other=0).to(tl.int64)
            k = tl.load(kk_ptr + slot[:, None] * s_kks + kvh * s_kkh + d[None, :],
                        mask=ok[:, None], other=0.0)
            v = tl.load(kv_ptr + slot[:, None] * s_kvs + kvh * s_kvh + d[None, :],
                        mask=ok[:, None], other=0.0)
            if FP8:
                ks = tl.load(ks_ptr + slot * s_kss + kvh * s_ksh, mask=ok, other=0.0)
                vs = tl.load(vs_ptr + slot * s_vss + kvh * s_vsh, mask=ok, other=0.0)
                m_i, l_i, acc = _attend_tile(q, k, v, ok, ks, vs, m_i, l_i, acc, qk_scale,
                                             True, DOT_FP32)
            else:
                m_i, l_i, acc = _attend_tile(q, k, v, ok, qk_scale, qk_scale, m_i, l_i, acc,
                                             qk_scale, False, DOT_FP32)
    # an empty split (past the request's length) leaves o = 0 and lse = -inf: weight zero
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    part = ((n * tl.num_programs(1) + kvh) * (num_splits + 1) + sp) * BLOCK_M + rows
    tl.store(lse_part_ptr + part, tl.where(seen, m_i + tl.log2(l_safe), float("-inf")))
    tl.store(o_part_ptr + part[:, None] * DH + d[None, :], acc / l_safe[:, None])


@triton.jit
def _combine_kernel(o_part_ptr, lse_part_ptr, o_ptr, B, num_splits, s_on, s_ob, s_oh,
                    G: tl.constexpr, DH: tl.constexpr, BLOCK_M: tl.constexpr):
    n, kvh = tl.program_id(0).to(tl.int64), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    b, head = rows // G, kvh * G + rows % G
    d = tl.arange(0, DH)
    first = (n * tl.num_programs(1) + kvh) * (num_splits + 1)
    # the block's partial first: it always has B >= 1 keys, so the running max starts finite
    at = (first + num_splits) * BLOCK_M + rows
    m = tl.load(lse_part_ptr + at)
    den = tl.full([BLOCK_M], 1.0, tl.float32)
    acc = tl.load(o_part_ptr + at[:, None] * DH + d[None, :])
    for sp in range(0, num_splits):
        at = (first + sp) * BLOCK_M + rows
        lse = tl.load(lse_part_ptr + at)
        m_new = tl.maximum(m, lse)
        alpha, w = tl.exp2(m - m_new), tl.exp2(lse - m_new)
        den = den * alpha + w
        part = tl.load(o_part_ptr + at[:, None] * DH + d[None, :])
        acc = acc * alpha[:, None] + w[:, None] * part
        m = m_new
    o = acc / den[:, None]
    out = o_ptr + n * s_on + b[:, None] * s_ob + head[:, None] * s_oh + d[None, :]
    tl.store(out, o.to(o_ptr.dtype.element_ty), mask=(b < B)[:, None])


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # the H200's count: CPU (interpreter) runs split as the GPU would
    return torch.cuda.get_device_properties(device).multi_processor_count


def context_splits(n: int, kv_heads: int, max_len: int, block_n: int = BLOCK_N,
                   num_sms: int = 132) -> int:
    """Context splits per (request, KV head): enough programs for WAVES per SM, but no split
    shorter than MIN_SPLIT_ROWS rows. Host integers only (Lmax, not the device lengths).
    132 requests x 2 KV heads at 64K: 4 splits of 16K rows, 1,056 context programs."""
    want = -(-WAVES * num_sms // max(1, n * kv_heads))
    most = -(-max_len // max(block_n, MIN_SPLIT_ROWS))
    return max(1, min(want, most))


def _check(q, k_blk, v_blk, kv_k, kv_v, ctx_slots, ctx_lens, kv_k_scale, kv_v_scale) -> bool:
    """Shapes and dtypes the kernel relies on; returns whether the draft KV is FP8."""
    n, b, h, dh = q.shape
    hkv = k_blk.shape[2]
    if k_blk.shape != (n, b, hkv, dh) or v_blk.shape != k_blk.shape or h % hkv:
        raise ValueError(f"q {tuple(q.shape)} and block k/v {tuple(k_blk.shape)}, "
                         f"{tuple(v_blk.shape)} do not agree (H must be a multiple of HKV)")
    if kv_k.shape[1:] != (hkv, dh) or kv_v.shape != kv_k.shape:
        raise ValueError(f"draft KV {tuple(kv_k.shape)}, {tuple(kv_v.shape)} is not "
                         f"[S, {hkv}, {dh}]")
    if kv_k.stride(-1) != 1 or kv_v.stride(-1) != 1:
        raise ValueError("draft KV rows must be contiguous along head_dim")
    if dh < 16 or dh & (dh - 1):
        raise ValueError(f"head_dim must be a power of two >= 16 (tl.dot tiles), got {dh}")
    if ctx_slots.dim() != 2 or ctx_slots.shape[0] != n or tuple(ctx_lens.shape) != (n,):
        raise ValueError(f"ctx_slots {tuple(ctx_slots.shape)} / ctx_lens "
                         f"{tuple(ctx_lens.shape)} are not [{n}, Lmax] / [{n}]")
    fp8 = kv_k.dtype == torch.float8_e4m3fn
    if fp8 != (kv_k_scale is not None) or (kv_k_scale is None) != (kv_v_scale is None):
        raise ValueError("E4M3 draft KV needs both per-(slot, head) scales; bf16 takes none")
    if fp8 and (kv_k_scale.shape != kv_k.shape[:2] or kv_v_scale.shape != kv_k.shape[:2]):
        raise ValueError(f"scales {tuple(kv_k_scale.shape)} are not [S, HKV]")
    return fp8


def draft_attention(q: torch.Tensor, k_blk: torch.Tensor, v_blk: torch.Tensor,
                    kv_k: torch.Tensor, kv_v: torch.Tensor, ctx_slots: torch.Tensor,
                    ctx_lens: torch.Tensor, scale: float,
                    kv_k_scale: torch.Tensor | None = None,
                    kv_v_scale: torch.Tensor | None = None, *, num_splits: int | None = None,
                    block_n: int = BLOCK_N) -> torch.Tensor:
    """``ref.draft_attention_ref`` without gathering: q [N, B, H, Dh]; k_blk, v_blk
    [N, B, HKV, Dh]; kv_k, kv_v [S, HKV, Dh] bf16 (or E4M3 with kv_k_scale, kv_v_scale [S, HKV]
    fp32); ctx_slots [N, Lmax] int32/int64 (entries at or beyond ctx_lens[i] never read);
    ctx_lens [N] on the device, each <= Lmax -> o [N, B, H, Dh] in q.dtype."""
    fp8 = _check(q, k_blk, v_blk, kv_k, kv_v, ctx_slots, ctx_lens, kv_k_scale, kv_v_scale)
    n, b, h, dh = q.shape
    hkv = k_blk.shape[2]
    g, lmax = h // hkv, ctx_slots.shape[1]
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if n == 0:
        return o
    q, k_blk, v_blk = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k_blk, v_blk))
    ctx_slots = ctx_slots if ctx_slots.stride(-1) == 1 else ctx_slots.contiguous()
    splits = num_splits or context_splits(n, hkv, lmax, block_n, _num_sms(q.device))
    chunk = max(1, -(-max(lmax, 1) // (splits * block_n))) * block_n  # whole tiles per split
    block_m = max(16, triton.next_power_of_2(g * b))
    o_part = torch.empty(n, hkv, splits + 1, block_m, dh, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(n, hkv, splits + 1, block_m, dtype=torch.float32, device=q.device)
    if not q.is_cuda:
        interpret_casts.install()  # round the final fp32 -> bf16 store as the GPU does
    ks, vs = (kv_k_scale, kv_v_scale) if fp8 else (kv_k[:, :, 0], kv_v[:, :, 0])  # unused
    _split_kernel[(n, hkv, splits + 1)](
        q, k_blk, v_blk, kv_k, kv_v, ks, vs, ctx_slots, ctx_lens, o_part, lse_part,
        scale * LOG2E, b, lmax, chunk, splits,
        q.stride(0), q.stride(1), q.stride(2), k_blk.stride(0), k_blk.stride(1),
        k_blk.stride(2), v_blk.stride(0), v_blk.stride(1), v_blk.stride(2),
        kv_k.stride(0), kv_k.stride(1), kv_v.stride(0), kv_v.stride(1),
        ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1), ctx_slots.stride(0),
        G=g, DH=dh, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_B=max(16, triton.next_power_of_2(b)), FP8=fp8,
        DOT_FP32=not q.is_cuda or q.dtype == torch.float32, num_warps=4)
    _combine_kernel[(n, hkv)](o_part, lse_part, o, b, splits, o.stride(0), o.stride(1),
                              o.stride(2), G=g, DH=dh, BLOCK_M=block_m, num_warps=4)
    return o

