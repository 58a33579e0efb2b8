"""Which schedule and tile shape the sparse-MLA Partial kernel runs with: a pure, printable rule.

``choose_block(arch, kv_layout, query_rows, heads)`` returns a frozen ``SparseMlaConfig``; nothing
here touches a GPU, so the rule is unit-tested on CPU and printed beside every benchmark row.

Schedules (``Schedule``): ``SERIAL`` is the first-generation kernel (gather, sync, QK, softmax, PV
in one loop; ``sparse_mla_tilelang.partial_program``); ``PIPELINED`` the ``T.Pipelined`` kernel
with cp.async stages (bf16 rows) and ``WS`` the seesaw warp-specialised 64-head kernel
(``sparse_mla_ws``, second generation); ``WS1C`` (16 heads) and ``WSPV`` (64 heads) the third
generation (``sparse_mla_gen3``): a producer warpgroup gathers, and for FP8 rows dequantises,
into bf16 stages for consumer warpgroups that only compute.

The rule (``pick_schedule``), 2026-12-03, before its first H200 run (predictions in NOTES.md;
``enabled`` lets a benchmark leave out a schedule whose GPU tests failed, the rule then falls
back to the round-2 rule, ``choose_block_v2``):
- SM90, rank a multiple of 128 (FP8 scales per 128 channels), 64-column tiles: ``WSPV`` for
  64-head CTAs, ``WS1C`` with 3 stages and a 4-chunk QK for 16-head CTAs, every layout.
- Round-2 rule (H200, 2026-12-02): bf16 rows ``PIPELINED`` (2.2-2.8x over the first
  generation), FP8 rows ``SERIAL``.
- Otherwise ``choose_block_v1``: the first-generation rule, measured on H200 2026-11-30
  (data/bench/dsa.jsonl): heads per CTA 64 when possible (3.2-3.4x over four 16-head CTAs);
  ``block_i`` 128 for 64-head CTAs whose tile fits shared memory (1.23-1.34x over 32), else 32
  (16-head CTAs were 1.5-1.7x *slower* with 128: the serial loop needs several CTAs per SM).
- KV splits, first generation: 1 when the grid covers every SM (Combine is then skipped), else
  the smallest power of two that does, at most 16. Later generations (one CTA per SM: their
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
    WS = "ws"  # producer warpgroup + two seesaw consumer warpgroups, 2 stages (sparse_mla_ws)
    PIPELINED = "pipelined"  # T.Pipelined cp.async stages (sparse_mla_ws)
    WS1C = "ws1c"  # 16 heads: producer + one mma.sync consumer warpgroup (sparse_mla_gen3)
    WSPV = "wspv"  # 64 heads: producer + QK/softmax/PV-left + PV-right (sparse_mla_gen3)


THIRD_GENERATION = frozenset({Schedule.WS1C, Schedule.WSPV})
ALL_SCHEDULES = frozenset(Schedule)
# What the model path runs: the schedules that passed their GPU tests on an H200. The third
# generation was built and compiled on 2026-12-03 but has not run on a GPU yet; benchmarks and
# its tests enable it explicitly, and it joins this set after its first passing H200 run.
VALIDATED = ALL_SCHEDULES - THIRD_GENERATION


def threads_for(schedule: Schedule, heads_per_cta: int) -> int:
    """Default thread count (pipelined 16-head CTAs may also run 256)."""
    if schedule in (Schedule.WS, Schedule.WSPV):
        return 384
    if schedule is Schedule.WS1C:
        return 256
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
    stages: int = 1  # shared-memory KV stages (ws, wspv: 2; pipelined: 2 or 3; ws1c: 2-4)
    qk_chunks: int = 1  # ws1c: S = Q K^T as 1 or 4 GEMMs over 512 / qk_chunks channels

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
        if self.schedule is Schedule.WSPV and (self.block_i != 64 or self.stages != 2
                                               or self.heads_per_cta != 64):
            raise ValueError("the wspv schedule runs 64-head CTAs over 64-column tiles in 2 "
                             "stages")
        if self.schedule is Schedule.WS1C and (self.block_i != 64 or self.stages not in (2, 3, 4)
                                               or self.heads_per_cta != 16):
            raise ValueError("the ws1c schedule runs 16-head CTAs over 64-column tiles in 2-4 "
                             "stages")
        if self.qk_chunks not in (1, 4) or (self.qk_chunks != 1
                                            and self.schedule is not Schedule.WS1C):
            raise ValueError(f"qk_chunks {self.qk_chunks}: 1, or 4 with the ws1c schedule")

    @property
    def name(self) -> str:
        """Short variant name for benchmark rows: ``ws-b64-h16``, ``serial-b32-h16``."""
        multi = (Schedule.PIPELINED, Schedule.WS1C)
        stages = f"-s{self.stages}" if self.schedule in multi else ""
        if self.threads != threads_for(self.schedule, self.heads_per_cta):
            stages += f"-t{self.threads}"
        if self.qk_chunks != 1:
            stages += f"-q{self.qk_chunks}"
        return f"{self.schedule.value}-b{self.block_i}-h{self.heads_per_cta}{stages}"

    def describe(self) -> str:
        return (f"schedule={self.schedule.value} block_i={self.block_i} "
                f"heads_per_cta={self.heads_per_cta} splits={self.num_splits} "
                f"threads={self.threads} stages={self.stages} qk_chunks={self.qk_chunks}")


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


def pick_schedule(arch: GpuArch, kv_layout: MlaKVLayout, heads_per_cta: int,
                  block_i: int | None = None,
                  enabled: frozenset[Schedule] = VALIDATED) -> Schedule:
    """The schedule the rule runs: the third generation where it reads the layout and is
    enabled, else the round-2 rule (pipelined for bf16 rows, first generation otherwise).

    ``enabled`` names the schedules trusted on this GPU (a benchmark leaves out a schedule
    whose GPU tests failed); a forced tile width other than 64 means the first generation.
    """
    if arch.major != 9 or not second_generation_reads(kv_layout) or block_i not in (None, 64):
        return Schedule.SERIAL
    third = Schedule.WSPV if heads_per_cta == 64 else Schedule.WS1C
    if third in enabled:
        return third
    if kv_layout.format is KVFormat.BF16 and Schedule.PIPELINED in enabled:
        return Schedule.PIPELINED
    return Schedule.SERIAL


WS1C_STAGES, WS1C_QK_CHUNKS = 3, 4  # the predicted best ws1c form (NOTES.md, 2026-12-03)


def choose_block(arch: GpuArch, kv_layout: MlaKVLayout, query_rows: int, heads: int,
                 block_i: int | None = None, heads_per_cta: int | None = None,
                 schedule: Schedule | None = None, stages: int | None = None,
                 threads: int | None = None, qk_chunks: int | None = None,
                 enabled: frozenset[Schedule] = VALIDATED) -> SparseMlaConfig:
    """The kernel config for one call; the keyword arguments force a choice (benchmarks).

    Example:
        >>> from glmlab.kernels.dsa.layout import BF16_512
        >>> choose_block(H200, BF16_512, query_rows=1024, heads=64, enabled=ALL_SCHEDULES).name
        'wspv-b64-h64'
        >>> choose_block(H200, BF16_512, query_rows=1056, heads=16, enabled=ALL_SCHEDULES).name
        'ws1c-b64-h16-s3-q4'
    """
    if schedule is None:
        hpc = heads_per_cta or heads_per_cta_for(heads)
        schedule = pick_schedule(arch, kv_layout, hpc, block_i, enabled)
    if schedule is Schedule.SERIAL:
        return choose_block_v1(arch, kv_layout, query_rows, heads, block_i, heads_per_cta)
    wide = (Schedule.WS, Schedule.WSPV)
    hpc = heads_per_cta or (64 if schedule in wide else 16 if schedule is Schedule.WS1C
                            else heads_per_cta_for(heads))
    if schedule is Schedule.WS1C:
        stages = stages or WS1C_STAGES
        qk_chunks = qk_chunks or WS1C_QK_CHUNKS
    stages = stages or 2
    block_i = block_i or 64
    splits = splits_one_wave(arch, query_rows, heads, hpc)
    return SparseMlaConfig(block_i, hpc, splits, threads or threads_for(schedule, hpc), schedule,
                           stages, qk_chunks or 1)


def choose_block_v2(arch: GpuArch, kv_layout: MlaKVLayout, query_rows: int, heads: int
                    ) -> SparseMlaConfig:
    """The round-2 rule (H200, 2026-12-02): pipelined for bf16 rows, the first generation for
    FP8 rows. Kept callable as the "previous version" of benchmarks."""
    return choose_block(arch, kv_layout, query_rows, heads,
                        enabled=ALL_SCHEDULES - THIRD_GENERATION)


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
