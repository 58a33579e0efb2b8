"""Tile configs of the MoE grouped GEMMs: the config record, the tuned tables and ``choose_config``.

A table holds, per token count M (tokens *before* top-k expansion, the batch the MoE layer sees),
one ``KernelConfig`` for the gate_up GEMM and one for the down GEMM. Both GEMMs share one
alignment of the pairs, so a table entry always has the same BLOCK_SIZE_M in both. Tables are
JSON files under ``kernels/moe/configs/``, one per projection, named by ``table_filename``::

    moe-up-E288-A8-D4096-I2048-fp8w8a8-b128x128-NVIDIA_H200.json
    moe-down-E288-A8-D4096-I2048-fp8w8a8-b128x128-NVIDIA_H200.json

(E experts on this rank, A top-k, D hidden, I expert intermediate, the weight dtype with the FP8
block, the device name as ``torch.cuda.get_device_name`` gives it with spaces as ``_``). The file
format is documented in NOTES.md. ``choose_config`` is a pure function of (M, table): the nearest
tuned M, or the fixed default below when there is no table. Nothing here launches a kernel.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path

CONFIG_DIR = Path(__file__).parent / "configs"
FORMAT = "glmlab-moe-configs/1"
_JSON_KEYS = {"block_m": "BLOCK_SIZE_M", "block_n": "BLOCK_SIZE_N", "block_k": "BLOCK_SIZE_K",
              "group_m": "GROUP_SIZE_M", "num_warps": "num_warps", "num_stages": "num_stages"}


@dataclass(frozen=True)
class KernelConfig:
    """One grouped-GEMM launch: tile sizes, launch grouping, warps and software-pipeline stages."""

    block_m: int = 64
    block_n: int = 128
    block_k: int = 128
    group_m: int = 32
    num_warps: int = 4
    num_stages: int = 3

    def to_json(self) -> dict[str, int]:
        return {_JSON_KEYS[k]: v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict[str, int]) -> KernelConfig:
        return cls(**{k: int(d[j]) for k, j in _JSON_KEYS.items()})

    def short(self) -> str:
        return (f"M{self.block_m}N{self.block_n}K{self.block_k}G{self.group_m}"
                f"w{self.num_warps}s{self.num_stages}")

    def smem_bytes(self, elem_bytes: int) -> int:
        """Shared memory of the pipelined A and B tiles (the kernel's dominant use)."""
        return self.num_stages * (self.block_m + self.block_n) * self.block_k * elem_bytes


# Shared memory one CTA may take on sm_90 (227 KiB), less room for the epilogue's staging.
SMEM_LIMIT = (227 - 16) * 1024


def fit_stages(cfg: KernelConfig, elem_bytes: int, limit: int = SMEM_LIMIT) -> KernelConfig:
    """``cfg`` with as many of its pipeline stages as fit ``limit`` for operands of
    ``elem_bytes``: tables are tuned for E4M3 (1 byte), and the same tiles over bf16 or fp32
    weights (the tiny model's tests) need fewer stages, or the launch fails for shared memory."""
    stages = cfg.num_stages
    while stages > 1 and replace(cfg, num_stages=stages).smem_bytes(elem_bytes) > limit:
        stages -= 1
    return cfg if stages == cfg.num_stages else replace(cfg, num_stages=stages)


# The untuned fallback, as SGLang's fused MoE uses for block-FP8 without a config file.
DEFAULT_CONFIG = KernelConfig(block_m=64, block_n=128, block_k=128, group_m=32, num_warps=4,
                              num_stages=3)


@dataclass(frozen=True)
class MoEShape:
    """What a table is tuned for: the rank-local experts, top-k, widths and the weight format."""

    num_experts: int
    top_k: int
    hidden: int
    intermediate: int
    dtype: str = "fp8w8a8"  # or the plain weight dtype: "bf16", "fp16", "fp32"
    block: tuple[int, int] = (128, 128)

    @property
    def dtype_tag(self) -> str:
        return f"{self.dtype}-b{self.block[0]}x{self.block[1]}" if self.dtype == "fp8w8a8" \
            else self.dtype


@dataclass(frozen=True)
class ConfigTable:
    """Tuned configs by M; ``meta`` records how they were obtained (samples, search, versions)."""

    up: dict[int, KernelConfig]
    down: dict[int, KernelConfig]
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        for m, cfg in self.up.items():
            if m in self.down and self.down[m].block_m != cfg.block_m:
                raise ValueError(f"M={m}: up and down configs must share BLOCK_SIZE_M")


def merge_tables(base: ConfigTable | None, update: ConfigTable) -> ConfigTable:
    """``base`` with the M entries of ``update`` replacing or adding to its own."""
    if base is None:
        return update
    meta = {**base.meta, "updated": {"M": sorted(update.up), **update.meta}}
    return ConfigTable({**base.up, **update.up}, {**base.down, **update.down}, meta)


def choose_config(num_tokens: int, table: ConfigTable | None = None
                  ) -> tuple[KernelConfig, KernelConfig]:
    """(gate_up config, down config) for a batch of ``num_tokens`` tokens.

    The tuned entry with the nearest M (ties to the smaller M); without a table, the default.
    A missing down entry reuses the up config.
    """
    if table is None or not table.up:
        return DEFAULT_CONFIG, DEFAULT_CONFIG
    key = min(table.up, key=lambda m: (abs(m - num_tokens), m))
    up = table.up[key]
    return up, table.down.get(key, up)


def device_tag(device_name: str) -> str:
    return device_name.strip().replace(" ", "_")


def table_filename(kind: str, shape: MoEShape, device_name: str) -> str:
    if kind not in ("up", "down"):
        raise ValueError(f"kind must be 'up' or 'down', got {kind!r}")
    return (f"moe-{kind}-E{shape.num_experts}-A{shape.top_k}-D{shape.hidden}-"
            f"I{shape.intermediate}-{shape.dtype_tag}-{device_tag(device_name)}.json")


def save_table(table: ConfigTable, shape: MoEShape, device_name: str,
               directory: Path = CONFIG_DIR) -> list[Path]:
    """Write the up and down files (M keys ascending); returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind, entries in (("up", table.up), ("down", table.down)):
        doc = {"format": FORMAT, "kernel": kind, "device": device_name, "shape": asdict(shape),
               "meta": table.meta,
               "configs": {str(m): entries[m].to_json() for m in sorted(entries)}}
        path = directory / table_filename(kind, shape, device_name)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        paths.append(path)
    return paths


def read_table(shape: MoEShape, device_name: str, directory: Path = CONFIG_DIR
               ) -> ConfigTable | None:
    """The tuned table for (shape, device), or None when the up file does not exist."""
    up_path = directory / table_filename("up", shape, device_name)
    if not up_path.is_file():
        return None
    up_doc = json.loads(up_path.read_text())
    down_path = directory / table_filename("down", shape, device_name)
    down_doc = json.loads(down_path.read_text()) if down_path.is_file() else {"configs": {}}
    for doc in (up_doc, down_doc):
        if doc.get("format", FORMAT) != FORMAT:
            raise ValueError(f"{up_path.parent}: unknown config format {doc['format']!r}")
    up = {int(m): KernelConfig.from_json(c) for m, c in up_doc["configs"].items()}
    down = {int(m): KernelConfig.from_json(c) for m, c in down_doc["configs"].items()}
    return ConfigTable(up, down, up_doc.get("meta", {}))


@cache
def cached_table(shape: MoEShape, device_name: str) -> ConfigTable | None:
    """``read_table`` from the package's config folder, read once per process."""
    return read_table(shape, device_name)
