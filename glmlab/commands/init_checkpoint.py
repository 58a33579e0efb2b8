"""glmlab init-checkpoint: write a random checkpoint in the published layout."""

from __future__ import annotations

import argparse
import json

import torch

from glmlab import presets
from glmlab.checkpoint.writer import write_random_checkpoint

HELP = "write a random GLM-5.3-Flash checkpoint (HF layout, safetensors, tokenizer) for a preset"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="tiny, slice:N (real widths, N layers)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fp8", action="store_true", help="the real FP8 block-128 layout")
    p.add_argument("--device", default="cpu", help="where to draw the weights")
    p.add_argument("--max-shard-gb", type=float, default=5.0)


def run(args: argparse.Namespace) -> int:
    out = write_random_checkpoint(
        presets.preset(args.preset),
        args.out,
        seed=args.seed,
        fp8=args.fp8,
        dtype=torch.bfloat16,
        device=args.device,
        max_shard_bytes=int(args.max_shard_gb * (1 << 30)),
    )
    print(json.dumps({"checkpoint": str(out), "preset": args.preset, "fp8": args.fp8}))
    return 0
