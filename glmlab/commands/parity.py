"""glmlab parity: compare glmlab with transformers on one checkpoint and print the report."""

from __future__ import annotations

import argparse
import json

import torch

from glmlab.checkpoint.presets_dir import resolve_model
from glmlab.testing.parity import compare_greedy, compare_logits, prompt_ids

HELP = "logits and greedy-token parity against transformers' Glm5NextForConditionalGeneration"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny")
    p.add_argument("--lengths", default="5,17,40,70,120", help="prompt lengths")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--greedy-tokens", type=int, default=32)


def run(args: argparse.Namespace) -> int:
    path = resolve_model(args.model)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    lengths = tuple(int(x) for x in args.lengths.split(","))
    for row in compare_logits(path, lengths, dtype):
        print(json.dumps(row.row()))
    ours, theirs = compare_greedy(path, prompt_ids(24, 99), args.greedy_tokens, dtype)
    agree = sum(a == b for a, b in zip(ours, theirs, strict=True))
    print(json.dumps({"greedy_tokens": len(ours), "identical": ours == theirs, "agree": agree}))
    return 0
