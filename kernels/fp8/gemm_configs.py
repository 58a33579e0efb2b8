"""Tile configs of the block-FP8 dense GEMM (``gemm_triton.linear_fp8``) and the rule picking one.

``choose_config(M, N, K)`` is a pure function of the problem shape (and the SM count), so it is
unit-tested on the CPU and printed beside benchmark rows. The rule, and why:

- **Small M (M <= 64: decode, verify of a few requests).** The GEMM is a weight stream: N x K bytes
  of E4M3 must cross HBM once while the activations sit in L2. The kernel runs *swap-AB*
  (C^T = W X^T): weight rows are the dot's M side (64 or 128 rows, so Hopper's wgmma applies,
  which needs M >= 64), tokens are its N side (padded to 16..64). Each program streams a
  ``block_n x K / split_k`` slab of the weight exactly once; ``split_k`` is chosen so that the
  grid holds at least two waves of programs on every SM (an SM needs ~64 KB in flight to keep
  HBM busy; four 16 KB stages per program, two programs per SM). Activations are quantised in
  the prologue (``fuse_quant``): a token's 128-channel group is re-quantised by every weight
  slab that reads it, which costs nothing next to the weight bytes at this M.
- **Larger M (prefill chunks, big verify batches).** Classic output tiles (64 or 128 rows x 128
  columns, 128-deep K steps); split-K only when the tile count leaves SMs idle and K is long.
  Above 128 rows the activations are quantised once by a separate kernel (re-quantising them in
  every column block would cost as much CUDA-core time as the FP8 dot saves).

- **One token (decode at batch 1): CUDA-core GEMV** (``kind="gemv"``, ``gemv_triton``). At M
  tokens every weight byte costs M fp32 FMAs plus one E4M3 -> fp32 convert; the H200 does
  ~33.5 T fp32 FMA/s against 4.8 TB/s of HBM, ~7 operations per byte at the roofline, so on
  arithmetic alone M <= 4 would fit. Measured on an H200 (4096x16384 and 24576x4096, CUDA
  graphs, L2 flushed): at M = 1 the GEMV fed E4M3 activations streamed at 0.57-0.67 of HBM,
  1-4% ahead of the best tensor-core config and ~20% ahead of quantising in its own prologue;
  at M = 4 it took 2.0-2.3x the tensor-core time (its per-step cross-lane reductions, not the
  FMAs, are the limit). So the rule takes it at one token only, with the activations quantised
  beforehand; the tuner times it up to M = 8.

``block_k`` is the 128-channel scale group for the tensor-core kinds: one activation scale and
one weight scale per K step, applied to the step's fp32 partial product. The GEMV loads
``block_k`` = 256 or 512 channels per step (wider contiguous weight loads) and applies each
128-group's scales to that group's partial sum.

``kind="scaled_mm"`` is ``torch._scaled_mm``'s block-wise FP8 GEMM (cuBLASLt, the same recipe;
``scaled_mm.py``). No rule picks it: a tuned table does, for a shape where it was timed fastest.

**Tuned tables win over the rule.** ``glmlab tune linear-fp8`` times candidate configs on a GPU
for the (N, K) of a model's FP8 linears at several M and writes
``configs/linear-fp8-<device>.json``; ``choose_config`` then takes the entry of the nearest tuned
M for that (N, K) (ties to the smaller M), and the rule above only for shapes no table covers.
The rule was written before any H200 measurement: on the first one (slice:4 decode at batch
128) its M=128 pick streamed the weights at 0.4 TB/s.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

H200_SMS = 132
CONFIG_DIR = Path(__file__).parent / "configs"
FORMAT = "glmlab-linear-fp8-configs/1"
GROUP = 128  # the block-FP8 scale group along K (and the weights' row-block along N)
SMALL_M = 64  # at or below: swap-AB weight streaming
GEMV_MAX_M = 1  # at or below: the CUDA-core GEMV (measured; see the module docstring)
KINDS = ("mma", "gemv", "scaled_mm")
FUSED_QUANT_MAX_M = 128  # at or below: activations quantised inside the GEMM


@dataclass(frozen=True)
class GemmConfig:
    block_m: int  # activation rows per program (tokens; the dot's N side when swap_ab)
    block_n: int  # weight rows per program
    split_k: int  # programs sharing one output tile along K (partials reduced in fixed order)
    swap_ab: bool
    fuse_quant: bool  # quantise the activations in the prologue (else the caller passes fp8 A)
    num_warps: int = 4
    num_stages: int = 4
    block_k: int = GROUP
    # "mma": the tensor-core kernel (tile or swap-AB); "gemv": the CUDA-core kernel for a few
    # tokens; "scaled_mm": torch._scaled_mm. Tables written before kinds existed load as "mma".
    kind: str = "mma"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown GEMM kind {self.kind!r}; want one of {KINDS}")
        if self.kind == "scaled_mm":
            # no tiles of its own: fixed placeholders, so that every scaled_mm config is equal
            if {k: getattr(self, k) for k in _SCALED_MM_FIELDS} != _SCALED_MM_FIELDS:
                raise ValueError(f"a scaled_mm config has no tiles of its own: {self}")
            return
        if self.kind == "gemv":
            # block_m is a register tile of tokens here; block_k spans whole scale groups
            if (self.block_m & (self.block_m - 1) or self.block_k % GROUP or self.swap_ab
                    or self.block_m > 16 or self.block_n < 1 or self.split_k < 1):
                raise ValueError(f"bad GEMV config {self}")
            return
        if self.block_k != GROUP:
            raise ValueError(f"block_k must be the FP8 scale group {GROUP}, got {self.block_k}")
        if self.block_m < 16 or self.block_n < 16 or self.split_k < 1:
            raise ValueError(f"bad tile {self}")

    def short(self) -> str:
        if self.kind == "scaled_mm":
            return "scaled_mm"
        q = "q" if self.fuse_quant else ""
        if self.kind == "gemv":
            return (f"gemv{q}M{self.block_m}N{self.block_n}K{self.block_k}S{self.split_k}"
                    f"w{self.num_warps}")
        kind = "swap" if self.swap_ab else "tile"
        return (f"{kind}{q}M{self.block_m}N{self.block_n}S{self.split_k}"
                f"w{self.num_warps}s{self.num_stages}")

    def smem_bytes(self, act_bytes: int) -> int:
        """Shared memory of the pipelined tiles: E4M3 weights + activations as loaded (an upper
        bound for the GEMV, whose loads Triton may keep in registers; 0 for ``scaled_mm``)."""
        if self.kind == "scaled_mm":
            return 0
        a = act_bytes if self.fuse_quant else 1
        return self.num_stages * (self.block_n + self.block_m * a) * self.block_k


_SCALED_MM_FIELDS = dict(block_m=16, block_n=16, split_k=1, swap_ab=False, fuse_quant=False,
                         num_warps=4, num_stages=1, block_k=GROUP)


def scaled_mm_config() -> GemmConfig:
    """The ``kind="scaled_mm"`` config (cuBLASLt picks its own tiles)."""
    return GemmConfig(**_SCALED_MM_FIELDS, kind="scaled_mm")


def _pow2_at_least(x: int, lo: int) -> int:
    p = lo
    while p < x:
        p *= 2
    return p


def _split(tiles: int, m: int, k: int, num_sms: int, min_blocks_per_split: int) -> int:
    """Smallest power-of-two split that gives >= 2 programs per SM, keeping each split's K long
    enough to pipeline (``min_blocks_per_split`` 128-deep steps) and the fp32 partials (written
    and read back: 8 * split * M * N bytes) under half the weight bytes (N * K)."""
    k_blocks = -(-k // GROUP)
    split = 1
    while (tiles * split < 2 * num_sms and split * 2 * min_blocks_per_split <= k_blocks
           and 2 * split * 16 * m <= k):
        split *= 2
    return split


def choose_config(m: int, n: int, k: int, num_sms: int = H200_SMS,
                  table: GemmTable | None = None) -> GemmConfig:
    """The tile config for y[M, N] = x[M, K] W[N, K]^T: ``table``'s entry for (N, K) at the
    nearest tuned M when it has one, else the rule (see the module docstring).

    Example:
        >>> choose_config(1, 8192, 4096).short()
        'gemvM1N16K512S2w4'
    """
    if min(m, n, k) < 1:
        raise ValueError(f"empty GEMM {m}x{n}x{k}")
    tuned = table.lookup(m, n, k) if table is not None else None
    if tuned is not None:
        return tuned
    return rule_config(m, n, k, num_sms)


def rule_config(m: int, n: int, k: int, num_sms: int = H200_SMS) -> GemmConfig:
    """The untuned rule alone (what ``choose_config`` falls back to)."""
    if m <= GEMV_MAX_M:
        return gemv_rule(m, n, k, num_sms)
    if m <= SMALL_M:
        block_m = _pow2_at_least(m, 16)
        block_n = 128 if -(-n // 128) >= 32 else 64  # keep >= 32 column slabs
        tiles = -(-n // block_n)
        split = _split(tiles, m, k, num_sms, 2)
        return GemmConfig(block_m, block_n, split, swap_ab=True, fuse_quant=True, num_warps=4,
                          num_stages=4)
    block_m = 64 if m <= 128 else 128
    tiles = -(-m // block_m) * -(-n // 128)
    split = _split(tiles, m, k, num_sms, 4)
    return GemmConfig(block_m, 128, split, swap_ab=False, fuse_quant=m <= FUSED_QUANT_MAX_M,
                      num_warps=4 if block_m == 64 else 8, num_stages=4 if block_m == 64 else 3)


def gemv_rule(m: int, n: int, k: int, num_sms: int = H200_SMS) -> GemmConfig:
    """The GEMV for M tokens: 16 weight rows x 512 channels (8 KB of E4M3) per program and step,
    E4M3 activations quantised beforehand, split-K until the grid holds >= 4 programs per SM
    (the loads are not software-pipelined, no dot to feed them, so the bytes in flight are the
    resident programs' steps). Splits stay within the K steps and keep the fp32 partials
    (8 * split * M * N bytes) under half the weight bytes, as ``_split`` does. On the H200 this
    was the fastest GEMV at 4096x16384 (M = 1); at 24576x4096 the fastest had 32 rows."""
    block_k = 512 if k >= 4 * 512 else 256  # wide steps once there are four of them
    block_n = 16
    tiles = -(-n // block_n)
    steps = -(-k // block_k)
    split = 1
    while tiles * split < 4 * num_sms and split * 2 <= steps and 2 * split * 16 * m <= k:
        split *= 2
    return GemmConfig(_pow2_at_least(m, 1), block_n, split, swap_ab=False, fuse_quant=False,
                      num_warps=4, num_stages=1, block_k=block_k, kind="gemv")


@dataclass(frozen=True)
class GemmTable:
    """Tuned configs: (N, K) -> {M: config}; ``meta`` says how they were measured."""

    entries: dict[tuple[int, int], dict[int, GemmConfig]]
    meta: dict = field(default_factory=dict, compare=False)

    def lookup(self, m: int, n: int, k: int) -> GemmConfig | None:
        by_m = self.entries.get((n, k))
        if not by_m:
            return None
        return by_m[min(by_m, key=lambda tuned: (abs(tuned - m), tuned))]

    def merged(self, other: GemmTable) -> GemmTable:
        """This table with ``other``'s (N, K, M) entries added or replacing its own."""
        entries = {nk: dict(by_m) for nk, by_m in self.entries.items()}
        for nk, by_m in other.entries.items():
            entries.setdefault(nk, {}).update(by_m)
        meta = {**self.meta, **other.meta}
        if "tokens" in self.meta or "tokens" in other.meta:  # the M's the table now holds
            meta["tokens"] = sorted({m for by_m in entries.values() for m in by_m})
        return GemmTable(entries, meta)

    def to_json(self, device: str) -> dict:
        return {"format": FORMAT, "device": device, "meta": self.meta,
                "configs": {f"{n}x{k}": {str(m): asdict(c) for m, c in sorted(by_m.items())}
                            for (n, k), by_m in sorted(self.entries.items())}}

    @classmethod
    def from_json(cls, doc: dict) -> GemmTable:
        if doc.get("format") != FORMAT:
            raise ValueError(f"unknown linear-fp8 config format {doc.get('format')!r}")
        entries = {}
        for nk, by_m in doc["configs"].items():
            n, k = (int(x) for x in nk.split("x"))
            entries[(n, k)] = {int(m): GemmConfig(**c) for m, c in by_m.items()}
        return cls(entries, doc.get("meta", {}))


def table_path(device_name: str, directory: Path = CONFIG_DIR) -> Path:
    return directory / f"linear-fp8-{device_name.strip().replace(' ', '_')}.json"


def save_table(table: GemmTable, device_name: str, directory: Path = CONFIG_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = table_path(device_name, directory)
    path.write_text(json.dumps(table.to_json(device_name), indent=1) + "\n")
    return path


def read_table(device_name: str, directory: Path = CONFIG_DIR) -> GemmTable | None:
    path = table_path(device_name, directory)
    return GemmTable.from_json(json.loads(path.read_text())) if path.is_file() else None


@cache
def cached_table(device_name: str) -> GemmTable | None:
    """``read_table`` from the package's config folder, read once per process."""
    return read_table(device_name)
