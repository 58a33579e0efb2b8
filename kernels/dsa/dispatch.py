"""Which tile shape the sparse-MLA Partial kernel runs with: a pure, printable rule.

``choose_block(arch, kv_layout, query_rows, heads)`` returns a frozen ``SparseMlaConfig``; nothing
here touches a GPU, so the rule is unit-tested on CPU and printed beside every benchmark row.

The rule, measured (H200, 2026-11-30, data/bench/dsa.jsonl; NOTES.md has the table):
- Heads per CTA: 64 when the head count allows it (one gathered KV tile serves 64 heads, and the
  64-row GEMMs lower to Hopper wgmma with two warpgroups), else 16 (a TP4 rank of GLM-5.3-Flash
  has 16 heads; 16-row GEMMs lower to mma.sync). For H = 64, 64-head CTAs ran 3.2-3.4x faster.
- KV tile width ``block_i``: 128 on SM90 for 64-head CTAs whose tiles fit shared memory, else 32.
  Measured: 64-head CTAs were 1.23-1.34x faster with 128-wide tiles at every M (128, 768, 1024)
  and KV layout (the seed saw 1.12x for its FP8 kernel at M1024); 16-head CTAs were 1.5-1.7x
  *slower* with them, because this kernel does not pipeline the tile loop: a 128-wide tile takes
  ~150 KB of shared memory, so one 128-thread CTA per SM is left with nothing to hide the gather
  behind, while 32-wide tiles fit four CTAs per SM. The seed's rule (FP8 KV + enough query
  parallelism -> 128) described its kernel, not this one; the layout enters here only through
  the shared-memory budget (rank x tile).
- KV splits: 1 when the grid already covers every SM (Combine then has nothing to merge and is
  skipped), else the smallest power of two that does, at most 16.

Iteration counts for the notebook: ``tile_iterations(2112, 32) == 66``, ``(2112, 128) == 17``.
"""

from __future__ import annotations

from dataclasses import dataclass

from glmlab.kernels.dsa.layout import MlaKVLayout

MAX_SPLITS = 16
SM90_SMEM_PER_CTA = 227 * 1024


@dataclass(frozen=True)
class GpuArch:
    """What the rule needs to know about a GPU: compute capability and multiprocessor count."""

    major: int
    minor: int
    num_sms: int

    @property
    def name(self) -> str:
        return f"sm{self.major}{self.minor}"

    @classmethod
    def current(cls, device=None) -> GpuArch:
        import torch

        p = torch.cuda.get_device_properties(device)
        return cls(p.major, p.minor, p.multi_processor_count)


H200 = GpuArch(9, 0, 132)


@dataclass(frozen=True)
class SparseMlaConfig:
    block_i: int  # KV entries per tile (columns of the index list per iteration)
    heads_per_cta: int  # 16 or 64 query heads share one gathered tile
    num_splits: int  # contiguous tile ranges per (row, head group), merged by Combine
    threads: int  # 128 for 16 heads, 256 for 64 heads (two warpgroups share N)

    def __post_init__(self):
        if self.block_i not in (32, 64, 128) or self.heads_per_cta not in (16, 64):
            raise ValueError(f"unsupported tile {self.block_i} x {self.heads_per_cta} heads")
        if not 1 <= self.num_splits <= MAX_SPLITS:
            raise ValueError(f"num_splits must be in 1..{MAX_SPLITS}, got {self.num_splits}")

    def describe(self) -> str:
        return (f"block_i={self.block_i} heads_per_cta={self.heads_per_cta} "
                f"splits={self.num_splits} threads={self.threads}")


def tile_iterations(width: int, block_i: int) -> int:
    """KV tiles a full index list of ``width`` columns takes (the last one virtually padded)."""
    return -(-width // block_i)


def heads_per_cta_for(heads: int) -> int:
    return 64 if heads % 64 == 0 else 16


def choose_splits(arch: GpuArch, query_rows: int, heads: int, heads_per_cta: int) -> int:
    ctas = max(1, query_rows) * -(-heads // heads_per_cta)
    splits = 1
    while ctas * splits < arch.num_sms and splits < MAX_SPLITS:
        splits *= 2
    return splits


def smem_bytes(rank: int, block_i: int, heads_per_cta: int) -> int:
    """Shared memory of one Partial CTA: bf16 queries, bf16 KV tile, bf16 probabilities (+ slack
    for indices, scales and reduction workspaces)."""
    return 2 * rank * (heads_per_cta + block_i) + 2 * heads_per_cta * block_i + 4096


def choose_block(arch: GpuArch, kv_layout: MlaKVLayout, query_rows: int, heads: int,
                 block_i: int | None = None, heads_per_cta: int | None = None) -> SparseMlaConfig:
    """The tile config for one call; ``block_i``/``heads_per_cta`` force a choice (benchmarks).

    Example:
        >>> from glmlab.kernels.dsa.layout import FP8_RAW_512
        >>> choose_block(H200, FP8_RAW_512, query_rows=1024, heads=64).describe()
        'block_i=128 heads_per_cta=64 splits=1 threads=256'
    """
    hpc = heads_per_cta or heads_per_cta_for(heads)
    if block_i is None:
        wide_fits = smem_bytes(kv_layout.rank, 128, hpc) <= SM90_SMEM_PER_CTA
        block_i = 128 if arch.major == 9 and hpc == 64 and wide_fits else 32
    splits = choose_splits(arch, query_rows, heads, hpc)
    return SparseMlaConfig(block_i, hpc, splits, 256 if hpc == 64 else 128)
