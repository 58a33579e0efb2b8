"""glmlab budget: pool sizes and max running requests for a model, TP degree, dtypes and memory.

    glmlab budget --scenario reference-final          the reference deployment's optimised decode
    glmlab budget --model full --tp 4 --context-len 66560 --kv-dtype fp8 --state-dtype bf16 \\
        --device-gib 140.4 --mem-fraction 0.84 --weight-gib 80 --max-running-requests 132
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass

import torch

from glmlab.cache.budget import GIB, BudgetInputs, plan_budget
from glmlab.cache.budget_report import budget_rows, reference_baseline, reference_final
from glmlab.cache.footprint import CacheFootprint
from glmlab.cache.storage import CacheDtypes
from glmlab.cliargs import add_dataclass_args, dataclass_from_args
from glmlab.config import ModelConfig
from glmlab.presets import preset

HELP = "print the memory budget: pool sizes, max running requests and why"
# The published reference deployment's decode configurations (docs/reference-numbers.md section 0),
# every pool derived from the model shape and dtypes (glmlab.cache.budget_report).
SCENARIOS = {"reference-baseline": reference_baseline, "reference-final": reference_final,
             "reference-final-kv-only": lambda: reference_final(slots_per_request=1)}
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}


@dataclass(frozen=True)
class BudgetQuery:
    model: str = "full"  # preset (full, tiny, slice:N) or checkpoint directory
    tp: int = 1
    context_len: int = 65_536 + 1_024
    page_size: int = 64
    kv_dtype: str = "bf16"  # latent: bf16 | fp8 | fp32
    index_dtype: str = "fp8"  # pooled indexer keys
    state_dtype: str = "fp32"  # KDA recurrent state: fp32 | bf16
    conv_dtype: str = "bf16"
    with_mtp: bool = False
    byte_budget_gib: float | None = None
    device_gib: float | None = None
    mem_fraction: float = 0.9
    weight_gib: float = 0.0
    max_running_requests: int | None = None
    state_slots: int | None = None
    extra_slots: int = 0
    slots_per_request: int = 1
    spec_slots: int = 0
    spec_bytes_per_slot: int = 0
    draft_bytes_per_token: int = 0
    max_pages: int | None = None
    shared_prefix_len: int = 0

    def inputs(self) -> BudgetInputs:
        cfg = ModelConfig.from_hf(preset(self.model) if not _is_dir(self.model) else self.model)
        dtypes = CacheDtypes(latent=_DTYPES[self.kv_dtype], pool_keys=_DTYPES[self.index_dtype],
                             recurrent=_DTYPES[self.state_dtype], conv=_DTYPES[self.conv_dtype])
        spec = dataclasses.replace(CacheFootprint.of(cfg, dtypes, self.tp, self.with_mtp),
                                   draft_bytes_per_token=self.draft_bytes_per_token)
        gib = lambda v: None if v is None else int(v * GIB)  # noqa: E731
        return BudgetInputs(
            footprint=spec, context_len=self.context_len, page_size=self.page_size,
            byte_budget=gib(self.byte_budget_gib), device_bytes=gib(self.device_gib),
            mem_fraction=self.mem_fraction, weight_bytes=gib(self.weight_gib) or 0,
            max_running_requests=self.max_running_requests, state_slots=self.state_slots,
            extra_slots=self.extra_slots, slots_per_request=self.slots_per_request,
            spec_slots=self.spec_slots, spec_bytes_per_slot=self.spec_bytes_per_slot,
            max_pages=self.max_pages, shared_prefix_len=self.shared_prefix_len,
            label=f"{self.model}, TP{self.tp}")


def _is_dir(spec: str) -> bool:
    from pathlib import Path

    return Path(spec).is_dir()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", choices=sorted(SCENARIOS),
                   help="one of the reference deployment's decode configurations (ignores the "
                        "other flags)")
    p.add_argument("--json", action="store_true", help="print the pools and caps as JSON")
    add_dataclass_args(p, BudgetQuery)


def run(args: argparse.Namespace) -> int:
    if args.scenario:
        x = SCENARIOS[args.scenario]()
    else:
        x = dataclass_from_args(BudgetQuery, args).inputs()
    b = plan_budget(x)
    if args.json:
        print(json.dumps({"pools": budget_rows(b), "max_running_requests": b.max_running_requests,
                          "num_pages": b.num_pages, "num_state_slots": b.num_state_slots,
                          "caps": [dataclasses.asdict(c) for c in b.caps]}))
    else:
        print(b.table())
    return 0
