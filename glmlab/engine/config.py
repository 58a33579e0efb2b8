"""EngineConfig: the runtime knobs of one engine instance.

The second of glmlab's two frozen configs (``ModelConfig`` describes the checkpoint; this one how
it is served): device and dtypes, how block-FP8 weights load, page size, per-step token budgets,
memory budget, cache number formats, radix mode, op backends. Fields may be given as strings
(``kv_dtype="fp8"``) and are normalised to their enums once, at construction. Values discovered
at run time (pool sizes, max running requests) are returned by ``glmlab.cache.budget``, never
written back here.

It lives with the engine so that ``glmlab.config`` stays the small, dependency-free reader of
config.json; the enums come from ``glmlab.core`` (the cache uses them too). CLI flags are
generated from the fields (``glmlab.cliargs``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import Enum

import torch

from glmlab.core import ComputeDtype, FP8Weights, IndexDtype, KVDtype, RadixMode, StateDtype
from glmlab.model.backends import Backends
from glmlab.speculative.config import SpecConfig

__all__ = ["ComputeDtype", "EngineConfig", "FP8Weights", "IndexDtype", "KVDtype", "RadixMode",
           "StateDtype"]


_ENUMS = {"dtype": ComputeDtype, "kv_dtype": KVDtype, "index_dtype": IndexDtype,
          "state_dtype": StateDtype, "radix": RadixMode, "fp8_weights": FP8Weights}


@dataclass(frozen=True)
class EngineConfig:
    device: str = "cpu"
    dtype: ComputeDtype = ComputeDtype.AUTO
    fp8_weights: FP8Weights = FP8Weights.DEQUANTIZE  # block-FP8 checkpoints: widen, or keep
    page_size: int = 64
    context_len: int | None = None  # longest prompt + output; None = the model's maximum
    max_num_batched_tokens: int = 8192  # tokens per step, decode and prefill together
    max_prefill_tokens: int = 16384  # prefill tokens per step
    chunked_prefill: bool = True
    chunk_size: int = 8192  # longest prefill chunk of one request (when chunked)
    mem_fraction: float = 0.85  # CUDA: share of device memory for weights + pools
    cache_bytes: int | None = None  # explicit byte budget for all pools (overrides mem_fraction)
    max_pages: int | None = None  # cap on KV pages (like --max-total-tokens)
    state_slots: int | None = None  # explicit recurrent-state slots (like --max-mamba-cache-size)
    max_running_requests: int | None = None  # None = what the pools allow
    extra_slots: int = 0  # state slots for requests in flight (PD decode preallocation)
    kv_dtype: KVDtype = KVDtype.AUTO
    index_dtype: IndexDtype = IndexDtype.AUTO
    state_dtype: StateDtype = StateDtype.FP32
    radix: RadixMode = RadixMode.OFF
    backends: Backends = field(default_factory=Backends)
    seed: int = 0  # base seed of sampled requests that bring none
    print_budget: bool = True  # print the budget table when the engine starts
    speculative: SpecConfig | None = None  # speculative decoding (glmlab.speculative); None = off
    # CUDA graphs of decode / verify steps (glmlab.engine.cuda_graph; fused backends on CUDA only)
    cuda_graph_max_bs: int = 256  # largest batch (requests) replayed from a graph
    disable_cuda_graph: bool = False

    def __post_init__(self) -> None:
        for name, enum in _ENUMS.items():
            value = getattr(self, name)
            if not isinstance(value, enum):
                try:
                    object.__setattr__(self, name, enum(str(value).lower()))
                except ValueError:
                    choices = ", ".join(e.value for e in enum)
                    raise ValueError(f"{name}={value!r}: choose one of {choices}") from None
        positive = ("page_size", "max_num_batched_tokens", "max_prefill_tokens",
                    "cuda_graph_max_bs")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.chunk_size < self.page_size or self.chunk_size % self.page_size:
            raise ValueError(f"chunk_size ({self.chunk_size}) must be a multiple of page_size "
                             f"({self.page_size}) (chunks end on page boundaries)")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        for name in ("cache_bytes", "max_pages", "state_slots", "max_running_requests",
                     "context_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or unset), got {value}")
        if isinstance(self.speculative, dict):  # from a JSON config
            object.__setattr__(self, "speculative", SpecConfig(**self.speculative))
        if self.extra_slots < 0:
            raise ValueError(f"extra_slots must be >= 0, got {self.extra_slots}")

    @property
    def model_dtype(self) -> torch.dtype:
        """The compute dtype: ``auto`` is bf16 on CUDA, fp32 on the CPU (transformers parity)."""
        if self.dtype is ComputeDtype.AUTO:
            return torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        return {ComputeDtype.BF16: torch.bfloat16, ComputeDtype.FP32: torch.float32}[self.dtype]

    def describe(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.value if isinstance(v, Enum) else (
                v.describe() if isinstance(v, Backends) else
                asdict(v) if isinstance(v, SpecConfig) else v)
        return out
