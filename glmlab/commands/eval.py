"""glmlab eval: bits per byte (and next-line exact match) of a checkpoint under engine settings.

    glmlab eval --model small --json                         # the committed validation split
    glmlab eval --model DIR --files a.py b.py --kv-dtype fp8 --state-dtype bf16 --json
    glmlab eval --model small --split test --attention dense --weights fp8 --completion-lines 64

Prints one JSON object with at least ``bits_per_byte`` and ``tokens`` (``--json``), or a line.
Engine flags are ``EngineConfig`` fields (``--dtype``, ``--kv-dtype``, ``--index-dtype``,
``--state-dtype``, ``--fp8-weights``, ``--backends-*``, ...); see ``glmlab.train.evaluate``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from glmlab.cliargs import add_dataclass_args, dataclass_from_args
from glmlab.engine.config import EngineConfig

HELP = "bits per byte and next-line exact match of a checkpoint on text files"
_ENGINE_EXCLUDE = ("speculative", "print_budget", "seed")
EVAL_CACHE_BYTES = 1 << 30  # pools for a few windows, not a device's worth


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory, or small / tiny")
    p.add_argument("--files", nargs="+", default=None, help="text files (default: --split)")
    p.add_argument("--split", choices=("val", "test"), default="val",
                   help="the committed corpus split scored when --files is not given")
    p.add_argument("--weights", choices=("bf16", "fp8"), default="bf16",
                   help="fp8: score the block-FP8 twin of a bf16 checkpoint")
    p.add_argument("--attention", choices=("sparse", "dense"), default="sparse",
                   help="dense: DSA keeps every causal position (index_topk past the context)")
    p.add_argument("--window", type=int, default=512, help="tokens per scored window")
    p.add_argument("--chunk", type=int, default=64, help="tokens per forward inside a window")
    p.add_argument("--batch", type=int, default=8, help="windows per forward")
    p.add_argument("--completion-lines", type=int, default=0,
                   help="next-line exact match on this many test-split lines")
    p.add_argument("--baseline", action="store_true",
                   help="add the byte-unigram bits per byte of the files (train-split counts)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--report", help="also append the result as a stamped row to this JSONL file")
    p.add_argument("--label", default="", help="the row's setting name (with --report)")
    add_dataclass_args(p, EngineConfig, exclude=_ENGINE_EXCLUDE)


def run(args: argparse.Namespace) -> int:
    from glmlab.train import corpus
    from glmlab.train.evaluate import byte_unigram_bpb, evaluate

    for name in ("window", "chunk", "batch"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1")
    engine = dataclass_from_args(EngineConfig, args, print_budget=False)
    if engine.cache_bytes is None:
        engine = replace(engine, cache_bytes=EVAL_CACHE_BYTES)
    files = [Path(f) for f in args.files] if args.files else corpus.split_files(args.split)
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"no such file: {', '.join(missing)}")
    completion = corpus.split_files("test") if args.completion_lines else None
    out = evaluate(args.model, files, engine, args.weights, args.attention, args.window,
                   args.chunk, args.batch, completion, args.completion_lines)
    out["split"] = None if args.files else args.split
    if args.baseline:
        train, _ = corpus.train_texts()
        out["byte_unigram_bpb"] = byte_unigram_bpb(train, [corpus.read_text(f) for f in files])
    if args.report:
        from glmlab.bench.ops import write_rows

        report = Path(args.report)
        write_rows([{"bench": "eval", "setting": args.label, **out}], report.parent, report.stem,
                   warmup=0, repetitions="one pass over the files")
    if args.json:
        print(json.dumps(out))
    else:
        extra = (f", next-line exact match {out['completion']['exact_match']:.3f}"
                 if "completion" in out else "")
        print(f"{out['bits_per_byte']:.4f} bits/byte over {out['tokens']} tokens "
              f"({out['bytes']} bytes, {out['files']} files){extra}")
    return 0
