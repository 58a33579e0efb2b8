"""Absorbed sparse MLA on Hopper in TileLang: Partial kernels, a Combine kernel, the launchers.

Three generations of Partial share one contract and one Combine. The first (``partial_program``,
``Schedule.SERIAL``, below) runs a serial tile loop; the second (``sparse_mla_ws``: seesaw
warp-specialised or ``T.Pipelined``) overlaps the gather with the MMAs; the third
(``sparse_mla_gen3``) gives the gather and the FP8 dequantisation to a producer warpgroup and the
MMAs to consumer warpgroups. ``sparse_mla_fwd`` / ``sparse_mla`` run whatever
``dispatch.choose_block`` picks; ``sparse_mla_fwd_v1`` / ``sparse_mla_v1`` keep the first
generation callable under its own rule (``choose_block_v1``) for benchmarks.

First-generation Partial, one CTA per (head group, query row, KV split):
  load the group's queries [HB, R] (pre-scaled by softmax_scale * log2 e, so scores are in base 2);
  for each KV tile of ``block_i`` index columns in the split's range:
      gather the tile's latent rows by slot (index -1, or a column past the list's end, is masked:
      the last tile is virtually padded, the index tensor is never extended), dequantising FP8
      rows to bf16 in shared memory (raw: scale 1; scaled: one fp32 scale per 128 channels);
      S = Q K^T over the R-wide latent; online softmax in base 2 (running max m, rescale alpha);
      O += P V with V = the same latent rows;
  write O / sum and LSE = log2(sum) + m per head (a split with nothing valid: O = 0, LSE = -2^30).
Combine, one CTA per (head group, query row): w_s = 2^(LSE_s - LSE), O = sum_s w_s O_s.

Shapes (kernels/README.md): T query rows, H heads, R latent rank, W index width, N token slots.
Every size but R and the tile shape is a run-time value, so one compiled kernel serves any batch,
index width and split count. The tile shape comes from ``dispatch.choose_block``; the byte layout
of a cached row from ``layout.MlaKVLayout`` (the cache writes with the same class).

What this module does not know: how indices were chosen (the indexer), where slots come from (the
cache), or any model weights. The torch specification is ``ref.sparse_mla_ref`` (whole op) and
``ref.sparse_mla_partial_ref`` / ``ref.sparse_mla_combine_ref`` (the two stages, split for split).
"""


import tilelang
import tilelang.language as T
import torch

from glmlab.kernels.dsa import sparse_mla_gen3, sparse_mla_ws
from glmlab.kernels.dsa.dispatch import (
    GpuArch,
    Schedule,
    SparseMlaConfig,
    choose_block,
    choose_block_v1,
)
from glmlab.kernels.dsa.layout import KVFormat, MlaKVLayout

LOG2E = 1.4426950408889634
EMPTY_LSE = -(2.0**30)  # base-2 LSE of a split (or row) with no valid index
SM90A = {"kind": "cuda", "arch": "sm_90a"}


def _kv_dtype(fmt: KVFormat) -> str:
    return "bfloat16" if fmt is KVFormat.BF16 else "float8_e4m3"


def partial_program(layout: MlaKVLayout, block_i: int, heads_per_cta: int, threads: int):
    """The Partial kernel as a TileLang PrimFunc (compile with ``tilelang.compile``)."""
    R, BI, HB = layout.rank, block_i, heads_per_cta
    G, NG, width_row = layout.group, max(1, layout.num_scales), layout.row_width
    scaled = layout.format is KVFormat.FP8_SCALED
    rows, heads, width = T.dynamic("rows"), T.dynamic("heads"), T.dynamic("width")
    slots, splits = T.dynamic("slots"), T.dynamic("splits")
    kv_dtype, acc = _kv_dtype(layout.format), "float32"
    scale_col = layout.scale_offset // 4

    @T.macro
    def body(Q, KV, KVS, Idx, PO, PL):
        with T.Kernel(T.ceildiv(heads, HB), rows, splits, threads=threads) as (bh, row, sp):
            q_s = T.alloc_shared([HB, R], "bfloat16")
            kv_s = T.alloc_shared([BI, R], "bfloat16")
            p_s = T.alloc_shared([HB, BI], "bfloat16")
            slot = T.alloc_shared([BI], "int32")
            scale_s = T.alloc_shared([BI, NG], acc)
            acc_s = T.alloc_fragment([HB, BI], acc)
            acc_o = T.alloc_fragment([HB, R], acc)
            m = T.alloc_fragment([HB], acc)
            m_prev = T.alloc_fragment([HB], acc)
            alpha = T.alloc_fragment([HB], acc)
            total = T.alloc_fragment([HB], acc)
            tile_sum = T.alloc_fragment([HB], acc)
            T.fill(acc_o, 0)
            T.fill(total, 0)
            T.fill(m, EMPTY_LSE)
            T.copy(Q[row, bh * HB:(bh + 1) * HB, :], q_s)
            num_tiles = T.ceildiv(width, BI)
            per_split = T.ceildiv(num_tiles, splits)
            first = sp * per_split
            last = T.min(first + per_split, num_tiles)
            for t in T.serial(T.max(last - first, 0)):
                for i in T.Parallel(BI):
                    col = (first + t) * BI + i
                    slot[i] = T.if_then_else(col < width, Idx[row, T.min(col, width - 1)], -1)
                if scaled:
                    for i, g in T.Parallel(BI, NG):
                        scale_s[i, g] = KVS[T.max(slot[i], 0), scale_col + g]
                    for i, d in T.Parallel(BI, R):
                        kv_s[i, d] = T.cast(T.cast(KV[T.max(slot[i], 0), d], acc)
                                            * scale_s[i, d // G], "bfloat16")
                else:
                    for i, d in T.Parallel(BI, R):
                        kv_s[i, d] = T.cast(KV[T.max(slot[i], 0), d], "bfloat16")
                T.gemm(q_s, kv_s, acc_s, transpose_B=True, clear_accum=True,
                       policy=T.GemmWarpPolicy.FullCol)
                for h, i in T.Parallel(HB, BI):
                    acc_s[h, i] = T.if_then_else(slot[i] >= 0, acc_s[h, i], -T.infinity(acc))
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
            T.copy(acc_o, PO[row, sp, bh * HB:(bh + 1) * HB, :])
            T.copy(total, PL[row, sp, bh * HB:(bh + 1) * HB])

    if scaled:
        @T.prim_func
        def sparse_mla_partial(Q: T.Tensor([rows, heads, R], "bfloat16"),
                               KV: T.Tensor([slots, width_row], kv_dtype),
                               KVS: T.Tensor([slots, width_row // 4], acc),
                               Idx: T.Tensor([rows, width], "int32"),
                               PO: T.Tensor([rows, splits, heads, R], acc),
                               PL: T.Tensor([rows, splits, heads], acc)):
            body(Q, KV, KVS, Idx, PO, PL)
    else:
        @T.prim_func
        def sparse_mla_partial(Q: T.Tensor([rows, heads, R], "bfloat16"),
                               KV: T.Tensor([slots, width_row], kv_dtype),
                               Idx: T.Tensor([rows, width], "int32"),
                               PO: T.Tensor([rows, splits, heads, R], acc),
                               PL: T.Tensor([rows, splits, heads], acc)):
            body(Q, KV, None, Idx, PO, PL)
    return sparse_mla_partial


def combine_program(rank: int, heads_per_cta: int = 16, threads: int = 128):
    """The Combine kernel: merge [T, S, H, R] partials by their base-2 LSEs into [T, H, R]."""
    R, HB, acc = rank, heads_per_cta, "float32"
    rows, heads, splits = T.dynamic("rows"), T.dynamic("heads"), T.dynamic("splits")

    @T.prim_func
    def sparse_mla_combine(PO: T.Tensor([rows, splits, heads, R], acc),
                           PL: T.Tensor([rows, splits, heads], acc),
                           Out: T.Tensor([rows, heads, R], acc),
                           Lse: T.Tensor([rows, heads], acc)):
        with T.Kernel(T.ceildiv(heads, HB), rows, threads=threads) as (bh, row):
            lse_max = T.alloc_fragment([HB], acc)
            lse_sum = T.alloc_fragment([HB], acc)
            weight = T.alloc_fragment([HB], acc)
            acc_o = T.alloc_fragment([HB, R], acc)
            h0 = bh * HB
            T.fill(lse_max, EMPTY_LSE)
            T.fill(lse_sum, 0)
            T.fill(acc_o, 0)
            for s in T.serial(splits):
                for h in T.Parallel(HB):
                    lse_max[h] = T.max(lse_max[h], PL[row, s, h0 + h])
            for s in T.serial(splits):
                for h in T.Parallel(HB):
                    lse_sum[h] += T.exp2(PL[row, s, h0 + h] - lse_max[h])
            for s in T.serial(splits):
                for h in T.Parallel(HB):
                    weight[h] = T.exp2(PL[row, s, h0 + h] - lse_max[h]) / lse_sum[h]
                for h, d in T.Parallel(HB, R):
                    acc_o[h, d] += weight[h] * PO[row, s, h0 + h, d]
            for h in T.Parallel(HB):
                lse_sum[h] = lse_max[h] + T.log2(lse_sum[h])
            T.copy(acc_o, Out[row, h0:h0 + HB, :])
            T.copy(lse_sum, Lse[row, h0:h0 + HB])

    return sparse_mla_combine


# -------------------------------------------------------------------------------------------
# Compiled kernels, one per (layout, tile shape); every other size is a run-time value.
_KERNELS: dict[tuple, object] = {}


def _partial_key(layout: MlaKVLayout, config: SparseMlaConfig) -> tuple:
    return ("partial", layout, config.block_i, config.heads_per_cta, config.threads,
            config.schedule, config.stages, config.qk_chunks)


def _program(key: tuple):
    if key[0] != "partial":
        return combine_program(key[1])
    _, layout, block_i, heads_per_cta, threads, schedule, stages, qk_chunks = key
    if schedule is Schedule.WS1C:
        return sparse_mla_gen3.ws1c_program(layout, block_i, stages, qk_chunks)
    if schedule is Schedule.WSPV:
        return sparse_mla_gen3.wspv_program(layout, block_i)
    if schedule is Schedule.WS:
        return sparse_mla_ws.ws_program(layout, block_i, heads_per_cta)
    if schedule is Schedule.PIPELINED:
        return sparse_mla_ws.pipelined_program(layout, block_i, heads_per_cta, stages, threads)
    return partial_program(layout, block_i, heads_per_cta, threads)


def compiled(key: tuple):
    """The compiled kernel for ``key`` (``_partial_key(...)`` or ``("combine", rank)``)."""
    if key not in _KERNELS:
        _KERNELS[key] = tilelang.compile(_program(key), target=SM90A)
    return _KERNELS[key]


def precompile(jobs: list[tuple[MlaKVLayout, SparseMlaConfig]]) -> int:
    """Compile every kernel ``jobs`` need, in parallel (lowering and nvcc run in threads).

    Returns the number of kernels compiled now. Call once before timing or testing many configs.
    """
    keys = {_partial_key(lay, c) for lay, c in jobs} | {("combine", lay.rank) for lay, _ in jobs}
    todo = sorted((k for k in keys if k not in _KERNELS), key=repr)
    if todo:
        built = tilelang.par_compile([_program(k) for k in todo], target=SM90A)
        _KERNELS.update(zip(todo, built, strict=True))
    return len(todo)


# -------------------------------------------------------------------------------------------
def sparse_mla_partial(q: torch.Tensor, kv: torch.Tensor, layout: MlaKVLayout,
                       indices: torch.Tensor, softmax_scale: float, config: SparseMlaConfig
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Run Partial only.

    Args:
        q: [T, H, R] absorbed queries (any float dtype); H a multiple of ``config.heads_per_cta``.
        kv: [N, row_width] cache rows in ``layout`` (``layout.matches(kv)``).
        indices: [T, W] int32 slots into ``kv``, -1 padded; any W >= 1.
    Returns:
        partial_o [T, S, H, R] fp32 (normalised per split), partial_lse [T, S, H] fp32 (base 2).
    """
    t_len, heads, rank = q.shape
    if heads % config.heads_per_cta or rank != layout.rank or not layout.matches(kv):
        raise ValueError(f"q {tuple(q.shape)} / kv {kv.dtype}{tuple(kv.shape)} do not fit "
                         f"{layout} with {config.describe()}")
    q2 = prescale_queries(q, softmax_scale)
    idx = indices.to(torch.int32).contiguous()
    po = torch.empty(t_len, config.num_splits, heads, rank, dtype=torch.float32, device=q.device)
    pl = torch.empty(t_len, config.num_splits, heads, dtype=torch.float32, device=q.device)
    launch_partial(q2, kv, layout, idx, config, po, pl)
    return po, pl


def prescale_queries(q: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """[T, H, R] -> bf16 queries times ``softmax_scale * log2 e`` (the kernels' base-2 scores)."""
    return (q.float() * (softmax_scale * LOG2E)).to(torch.bfloat16).contiguous()


def launch_partial(q_scaled: torch.Tensor, kv: torch.Tensor, layout: MlaKVLayout,
                   indices: torch.Tensor, config: SparseMlaConfig, partial_o: torch.Tensor,
                   partial_lse: torch.Tensor) -> None:
    """The Partial kernel alone, on prepared buffers (benchmarks time exactly this).

    ``q_scaled`` from ``prescale_queries``; ``indices`` int32 contiguous; ``partial_o``
    [T, S, H, R] and ``partial_lse`` [T, S, H] fp32 with S = ``config.num_splits``.
    """
    kernel = compiled(_partial_key(layout, config))
    if layout.format is KVFormat.FP8_SCALED:
        kernel(q_scaled, kv.view(torch.float8_e4m3fn), kv.view(torch.float32), indices,
               partial_o, partial_lse)
    else:
        kernel(q_scaled, kv, indices, partial_o, partial_lse)


def sparse_mla_combine(partial_o: torch.Tensor, partial_lse: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge splits: [T, S, H, R], [T, S, H] -> out [T, H, R] fp32, lse [T, H] (base 2)."""
    t_len, splits, heads, rank = partial_o.shape
    if splits == 1:  # nothing to merge: the single split is already normalised
        return partial_o[:, 0], partial_lse[:, 0]
    out = torch.empty(t_len, heads, rank, dtype=torch.float32, device=partial_o.device)
    lse = torch.empty(t_len, heads, dtype=torch.float32, device=partial_o.device)
    compiled(("combine", rank))(partial_o, partial_lse, out, lse)
    return out, lse


def sparse_mla_fwd(q: torch.Tensor, kv: torch.Tensor, layout: MlaKVLayout, indices: torch.Tensor,
                   softmax_scale: float, config: SparseMlaConfig | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed sparse MLA: softmax over each row's listed slots of q . kv, times kv.

    Args:
        q: [T, H, R] absorbed queries. Any H: heads are zero-padded to the CTA's head group.
        kv: [N, row_width] one layer's latent cache in ``layout`` (bf16, raw FP8 or scaled FP8).
        indices: [T, W] slots, -1 padded (rows with no valid slot return zeros).
        config: tile shape; ``choose_block`` on the current GPU when None.
    Returns:
        out [T, H, R] fp32 and lse [T, H] fp32 (base 2, of the scaled scores; -2^30 when empty).

    Example:
        >>> lay = MlaKVLayout(KVFormat.FP8_SCALED, 512)
        >>> kv = lay.pack(torch.randn(4096, 512, device="cuda"))
        >>> idx = torch.randint(0, 4096, (8, 2051), device="cuda", dtype=torch.int32)
        >>> out, lse = sparse_mla_fwd(torch.randn(8, 16, 512, device="cuda"), kv, lay, idx, 1 / 16)
    """
    t_len, heads, rank = q.shape
    if config is None:
        config = choose_block(GpuArch.current(q.device), layout, t_len, heads)
    if config.schedule is not Schedule.SERIAL and not sparse_mla_gen3.supports(layout):
        raise ValueError(f"{config.schedule.value} kernels cannot read {layout}")
    if config.schedule is Schedule.PIPELINED and layout.format is not KVFormat.BF16:
        raise ValueError(f"the pipelined kernel reads bf16 rows only, not {layout}")
    pad = -heads % config.heads_per_cta
    if pad:
        q = torch.nn.functional.pad(q, (0, 0, 0, pad))
    if t_len == 0:
        return (q.new_zeros(0, heads, rank, dtype=torch.float32),
                q.new_zeros(0, heads, dtype=torch.float32))
    po, pl = sparse_mla_partial(q, kv, layout, indices, softmax_scale, config)
    out, lse = sparse_mla_combine(po, pl)
    return out[:, :heads], lse[:, :heads]


def sparse_mla(q: torch.Tensor, cache, layer: int, slot_indices: torch.Tensor,
               scale: float) -> torch.Tensor:
    """The ``tilelang`` SPARSE_MLA backend of ``glmlab.model`` (signature in model/backends.py).

    Reads ``cache.latent[layer]`` in whichever ``MlaKVLayout`` it is stored (bf16 or FP8).
    """
    latent = cache.latent[layer]
    layout = MlaKVLayout.of(latent, q.shape[-1])
    if slot_indices.shape[1] == 0:
        return q.new_zeros(q.shape, dtype=torch.float32)
    return sparse_mla_fwd(q, latent, layout, slot_indices, scale)[0]



def sparse_mla_fwd_v1(q: torch.Tensor, kv: torch.Tensor, layout: MlaKVLayout,
                      indices: torch.Tensor, softmax_scale: float
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``sparse_mla_fwd`` with the first-generation kernel and its own rule (benchmarks)."""
    config = choose_block_v1(GpuArch.current(q.device), layout, q.shape[0], q.shape[1])
    return sparse_mla_fwd(q, kv, layout, indices, softmax_scale, config)


def sparse_mla_v1(q: torch.Tensor, cache, layer: int, slot_indices: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """``sparse_mla`` (the model backend op) through the first-generation kernel."""
    latent = cache.latent[layer]
    layout = MlaKVLayout.of(latent, q.shape[-1])
    if slot_indices.shape[1] == 0:
        return q.new_zeros(q.shape, dtype=torch.float32)
    return sparse_mla_fwd_v1(q, latent, layout, slot_indices, scale)[0]
