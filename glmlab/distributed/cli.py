"""glmlab dist: run an interleaved context-parallel prefill on N local ranks, check it against one.

    glmlab dist --model tiny --ranks 2 --prompt-lens 37,27 --chunk 16 --moe-dispatch fp8-packet

Spawns N processes (gloo on CPU, NCCL with one GPU per rank), runs the prompts through the
CP-transformed model, and prints one JSON line: the CP logits against the single-process model
(plain, and with the same MoE recipe), the per-token all-gather payload of both MoE transports,
and the wall time.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import fields

import torch

from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.presets_dir import resolve_model
from glmlab.cliargs import add_dataclass_args, dataclass_from_args
from glmlab.distributed.check import (
    DTYPES,
    PrefillCase,
    cp_logits,
    cp_prefill_logits,
    single_prefill_logits,
)
from glmlab.distributed.cp import CPConfig, CPPrefill
from glmlab.distributed.fp8_packet import transport_bytes
from glmlab.distributed.parallel import ParallelLayout, ProcessGroups, launch
from glmlab.testing.compare import diff_stats

HELP = "run a context-parallel prefill on N local ranks and compare it with one process"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="checkpoint directory, or a preset name")
    p.add_argument("--ranks", type=int, default=2, help="CP size = number of processes")
    p.add_argument("--head-parallel", action=argparse.BooleanOptionalAction, default=True,
                   help="split KDA heads over the ranks (tp = cp); else run KDA replicated")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="default: nccl when there is one GPU per rank, else gloo")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    # Enum defaults go in as their values: argparse would pass str(enum) through ``type``.
    add_dataclass_args(p, CPConfig, defaults={f.name: getattr(CPConfig(), f.name).value
                                              for f in fields(CPConfig)})
    add_dataclass_args(p, PrefillCase, defaults={"prompt_lens": (37, 27)})


def run(args: argparse.Namespace) -> int:
    path = str(resolve_model(args.model))
    cfg, case = dataclass_from_args(CPConfig, args), dataclass_from_args(PrefillCase, args)
    n = args.ranks
    backend = args.backend or ("nccl" if torch.cuda.device_count() >= n else "gloo")
    layout = ParallelLayout(cp=n, tp=n if args.head_parallel else 1, ep=n)
    start = time.perf_counter()
    logits = launch(cp_prefill_logits, n, path, args.dtype, layout, [(cfg, case)],
                    backend=backend)[0][0]
    wall = time.perf_counter() - start
    device = "cuda" if backend == "nccl" else "cpu"

    def model():
        return load_model(path, dtype=DTYPES[args.dtype], device=device, with_mtp=False)

    plain = single_prefill_logits(model(), case)
    same_recipe = cp_logits(CPPrefill(model(), ProcessGroups.single(), cfg), case)
    m = model().cfg
    print(json.dumps({
        "ranks": n, "backend": backend, "layout": vars(layout), "moe_dispatch": cfg.moe_dispatch,
        "packet_kernels": cfg.packet_kernels, "prompt_lens": case.prompt_lens,
        "chunk": case.chunk, "tokens": sum(case.prompt_lens), "wall_s": round(wall, 2),
        "vs_single_same_moe_recipe": _short(diff_stats(same_recipe, logits)),
        "vs_single_plain_model": _short(diff_stats(plain, logits)),
        "argmax_agree_plain": float((plain.argmax(-1) == logits.argmax(-1)).float().mean()),
        "payload_per_token": transport_bytes(m.hidden_size, m.moe.top_k),
    }))
    return 0


def _short(stats: dict) -> dict:
    return {k: float(f"{v:.3g}") for k, v in stats.items() if k != "worst"}
