"""Which schedule and tile shape the sparse-MLA Partial kernel runs with: a pure, printable rule.

``choose_block(arch, kv_layout, query_rows, heads)`` returns a frozen ``SparseMlaConfig``; nothing
here touches a GPU, so the rule is unit-tested on CPU and printed beside every benchmark row.

Schedules (``Schedule``): ``SERIAL`` is the first-generation kernel (gather, sync, QK, softmax, PV
in one loop; ``sparse_mla_tilelang.partial_program``); ``PIPELINED`` the ``T.Pipelined`` kernel
with cp.async stages (bf16 rows); ``WS`` the warp-specialised 64-head kernel (a producer
warpgroup gathers and dequantises two 64-row stages ahead of two consumer warpgroups,
``sparse_mla_ws``).

The rule, from the H200 run of 2026-12-02 (``glmlab.bench.ops_dsa`` ``sparse_mla_best`` rows;
only schedules whose GPU tests passed there are eligible):
- bf16 rows on SM90 (rank a multiple of 128): ``PIPELINED``, 64-column tiles, 2 stages; 64 heads
  per CTA when the head count allows it, else 16 with 128 threads. Measured against the first
  generation: 2.2x (64 heads, 8K-32K rows), 2.3-2.8x (16 heads, M 128-8K).
- FP8 rows: ``SERIAL`` (``choose_block_v1``), the only FP8 schedule measured so far. The ws
  kernel (the FP8 candidate) hung in that run; it is benchmarked beside the rule until measured.
- Otherwise ``choose_block_v1``: the first-generation rule, measured on H200 2026-11-30
  (data/bench/dsa.jsonl): heads per CTA 64 when possible (3.2-3.4x over four 16-head CTAs);
  ``block_i`` 128 for 64-head CTAs whose tile fits shared memory (1.23-1.34x over 32), else 32
  (16-head CTAs were 1.5-1.7x *slower* with 128: the serial loop needs several CTAs per SM).
- KV splits, first generation: 1 when the grid covers every SM (Combine is then skipped), else
  the smallest power of two that does, at most 16. Second generation (one CTA per SM: its
  stages fill shared memory): as many splits as still fit one wave, ``num_sms // CTAs`` (at
  most 16, at least 1). A second wave of equal CTAs costs as much as the first, so splitting
  128 CTAs in two on 132 SMs would only add the Combine.

Iteration counts for the notebook: ``tile_iterations(2112, 32) == 66``, ``(2112, 128) == 17``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from glmlab.kernels.dsa.layout import KVFormat, MlaKVLayout

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


class Schedule(enum.Enum):
    SERIAL = "serial"  # first generation: one loop, no overlap (sparse_mla_tilelang)
    WS = "ws"  # producer warpgroup + two consumer warpgroups, 2 stages (sparse_mla_ws)
    PIPELINED = "pipelined"  # T.Pipelined cp.async stages (sparse_mla_ws)


def threads_for(schedule: Schedule, heads_per_cta: int) -> int:
    """Default thread count (pipelined 16-head CTAs may also run 256)."""
    if schedule is Schedule.WS:
        return 384
    return 256 if heads_per_cta == 64 else 128


def allowed_threads(schedule: Schedule, heads_per_cta: int) -> tuple[int, ...]:
    if schedule is Schedule.PIPELINED and heads_per_cta == 16:
        return (128, 256)
    return (threads_for(schedule, heads_per_cta),)


@dataclass(frozen=True)
class SparseMlaConfig:
    block_i: int  # KV entries per tile (columns of the index list per iteration)
    heads_per_cta: int  # 16 or 64 query heads share one gathered tile
    num_splits: int  # contiguous tile ranges per (row, head group), merged by Combine
    threads: int  # serial/pipelined: 128 (16 heads) or 256 (64); ws: 384
    schedule: Schedule = Schedule.SERIAL
    stages: int = 1  # shared-memory KV stages (ws: 2; pipelined: 2 or 3)

    def __post_init__(self):
        if self.block_i not in (32, 64, 128) or self.heads_per_cta not in (16, 64):
            raise ValueError(f"unsupported tile {self.block_i} x {self.heads_per_cta} heads")
        if not 1 <= self.num_splits <= MAX_SPLITS:
            raise ValueError(f"num_splits must be in 1..{MAX_SPLITS}, got {self.num_splits}")
        allowed = allowed_threads(self.schedule, self.heads_per_cta)
        if self.threads not in allowed:
            raise ValueError(f"{self.schedule.value} with {self.heads_per_cta} heads runs "
                             f"{' or '.join(map(str, allowed))} threads, not {self.threads}")
        if self.schedule is Schedule.WS and (self.block_i != 64 or self.stages != 2
                                             or self.heads_per_cta != 64):
            raise ValueError("the ws schedule runs 64-head CTAs over 64-column tiles in 2 "
                             "stages")

    @property
    def name(self) -> str:
        """Short variant name for benchmark rows: ``ws-b64-h16``, ``serial-b32-h16``."""
        stages = f"-s{self.stages}" if self.schedule is Schedule.PIPELINED else ""
        if self.threads != threads_for(self.schedule, self.heads_per_cta):
            stages += f"-t{self.threads}"
        return f"{self.schedule.value}-b{self.block_i}-h{self.heads_per_cta}{stages}"

    def describe(self) -> str:
        return (f"schedule={self.schedule.value} block_i={self.block_i} "
                f"heads_per_cta={self.heads_per_cta} splits={self.num_splits} "
                f"threads={self.threads} stages={self.stages}")


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


def splits_one_wave(arch: GpuArch, query_rows: int, heads: int, heads_per_cta: int) -> int:
    """Second generation: the most splits whose CTAs (one per SM) still fit one wave."""
    ctas = max(1, query_rows) * -(-heads // heads_per_cta)
    return max(1, min(MAX_SPLITS, arch.num_sms // ctas))


def smem_bytes(rank: int, block_i: int, heads_per_cta: int) -> int:
    """Shared memory of one Partial CTA: bf16 queries, bf16 KV tile, bf16 probabilities (+ slack
    for indices, scales and reduction workspaces)."""
    return 2 * rank * (heads_per_cta + block_i) + 2 * heads_per_cta * block_i + 4096


def second_generation_reads(kv_layout: MlaKVLayout) -> bool:
    """``sparse_mla_ws`` moves whole 128-channel chunks per producer thread group."""
    return kv_layout.rank % 128 == 0 and (kv_layout.num_scales == 0 or kv_layout.group == 128)


def choose_block(arch: GpuArch, kv_layout: MlaKVLayout, query_rows: int, heads: int,
                 block_i: int | None = None, heads_per_cta: int | None = None,
                 schedule: Schedule | None = None, stages: int | None = None,
                 threads: int | None = None) -> SparseMlaConfig:
    """The kernel config for one call; the keyword arguments force a choice (benchmarks).

    Example:
        >>> from glmlab.kernels.dsa.layout import BF16_512
        >>> choose_block(H200, BF16_512, query_rows=1024, heads=64).describe()
        'schedule=pipelined block_i=64 heads_per_cta=64 splits=1 threads=256 stages=2'
    """
    if schedule is None:  # a forced tile width other than 64 means the first generation
        second = (arch.major == 9 and second_generation_reads(kv_layout)
                  and block_i in (None, 64) and kv_layout.format is KVFormat.BF16)
        schedule = Schedule.PIPELINED if second else Schedule.SERIAL
    if schedule is Schedule.SERIAL:
        return choose_block_v1(arch, kv_layout, query_rows, heads, block_i, heads_per_cta)
    hpc = heads_per_cta or (64 if schedule is Schedule.WS else heads_per_cta_for(heads))
    stages = stages or 2
    block_i = block_i or 64
    splits = splits_one_wave(arch, query_rows, heads, hpc)
    return SparseMlaConfig(block_i, hpc, splits, threads or threads_for(schedule, hpc), schedule,
                           stages)


def choose_block_v1(arch: GpuArch, kv_layout: MlaKVLayout, query_rows: int, heads: int,
                    block_i: int | None = None, heads_per_cta: int | None = None
                    ) -> SparseMlaConfig:
    """The first-generation (``Schedule.SERIAL``) rule, as measured on H200 2026-11-30.

    Example:
        >>> from glmlab.kernels.dsa.layout import FP8_RAW_512
        >>> choose_block_v1(H200, FP8_RAW_512, query_rows=1024, heads=64).describe()
        'schedule=serial block_i=128 heads_per_cta=64 splits=1 threads=256 stages=1'
    """
    hpc = heads_per_cta or heads_per_cta_for(heads)
    if block_i is None:
        wide_fits = smem_bytes(kv_layout.rank, 128, hpc) <= SM90_SMEM_PER_CTA
        block_i = 128 if arch.major == 9 and hpc == 64 and wide_fits else 32
    splits = choose_splits(arch, query_rows, heads, hpc)
    return SparseMlaConfig(block_i, hpc, splits, threads_for(Schedule.SERIAL, hpc))
