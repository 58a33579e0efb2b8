"""glmlab generate: run a prompt through a checkpoint and print the continuation."""

from __future__ import annotations

import argparse
import json

import torch

from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.presets_dir import resolve_model
from glmlab.cliargs import add_dataclass_args, dataclass_from_args
from glmlab.engine.sampler import SamplingParams
from glmlab.model.session import Session
from glmlab.tokenizer import Tokenizer

HELP = "generate a continuation (greedy by default) from --prompt or --prompt-ids"
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory, or the preset 'tiny'")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="text prompt")
    src.add_argument("--prompt-ids", help="comma-separated token ids")
    p.add_argument("--json", action="store_true", help='print {"output_ids": [...], "text": "..."}')
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="fp32")
    p.add_argument("--device", default="cpu")
    add_dataclass_args(p, SamplingParams, exclude=("stop",), defaults={"max_new_tokens": 32})


def _prompt_ids(args, tok: Tokenizer) -> list[int]:
    if args.prompt is not None:
        return tok.encode(args.prompt)
    try:
        return [int(x) for x in args.prompt_ids.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}")


def run(args: argparse.Namespace) -> int:
    path = resolve_model(args.model)
    params = dataclass_from_args(SamplingParams, args)
    tok = Tokenizer.from_dir(path)
    model = load_model(path, dtype=_DTYPES[args.dtype], device=args.device)
    ids = _prompt_ids(args, tok)
    if not ids:
        raise ValueError("the prompt is empty")
    bad = [i for i in ids if not 0 <= i < model.cfg.vocab_size]
    if bad:
        raise ValueError(f"token ids out of range [0, {model.cfg.vocab_size}): {bad[:5]}")
    session = Session(model, num_seqs=1, max_len=len(ids) + params.max_new_tokens)
    out = session.generate(0, ids, params, tok.eos_token_ids or model.cfg.eos_token_ids)
    text = tok.decode(out)
    print(json.dumps({"output_ids": out, "text": text}) if args.json else text)
    return 0
