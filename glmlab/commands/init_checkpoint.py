"""glmlab init-checkpoint: write a random checkpoint in the published layout, or a draft for one.

``--preset tiny|slice:N --out DIR`` writes a target model (config.json, safetensors, tokenizer,
chat template; the MTP layer is part of it). ``--draft dflash2 --target DIR --out DIR2`` writes a
random DFlash2 block drafter shaped for that target (``glmlab.speculative.dflash_io``): pass it to
``glmlab generate --speculative dflash2 --speculative-draft-path DIR2``. The mask token is the
target tokenizer's ``<|mask|>`` (or ``--mask-token-id``). Random weights: acceptance is near zero
unless ``--speculative-simulate-accept-len`` is set; the output tokens are the target's either way.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from glmlab import presets
from glmlab.checkpoint.writer import write_random_checkpoint
from glmlab.config import ModelConfig
from glmlab.tokenizer import Tokenizer

HELP = ("write a random GLM-5.3-Flash checkpoint (HF layout, safetensors, tokenizer) for a preset, "
        "or with --draft dflash2 --target DIR a random DFlash2 draft for that target")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="tiny, slice:N (real widths, N layers)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0, help="random-number seed of the weights")
    p.add_argument("--fp8", action="store_true", help="the real FP8 block-128 layout")
    p.add_argument("--device", default="cpu", help="where to draw the weights")
    p.add_argument("--max-shard-gb", type=float, default=5.0)
    draft = p.add_argument_group("draft (with --draft)")
    draft.add_argument("--draft", choices=("dflash2",), help="write a draft model instead")
    draft.add_argument("--target", help="the target checkpoint directory the draft is for")
    draft.add_argument("--draft-layers", type=int, default=2, help="draft decoder layers")
    draft.add_argument("--block-size", type=int, default=8, help="DFlash2 block (anchor + drafts)")
    draft.add_argument("--mask-token-id", type=int,
                       help="mask token id (default: <|mask|> in the target's tokenizer.json)")


def run(args: argparse.Namespace) -> int:
    if args.draft:
        return _write_draft(args)
    if args.target:
        raise ValueError("--target is for a draft: add --draft dflash2")
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


def _write_draft(args: argparse.Namespace) -> int:
    # imported here: the target-only path needs nothing from speculative/
    from glmlab.speculative.dflash_io import MASK_TOKEN, write_random_draft

    if not args.target:
        raise ValueError("--draft dflash2 needs --target DIR (the checkpoint it drafts for)")
    target = Path(args.target)
    if not (target / "config.json").is_file():
        raise FileNotFoundError(f"{target}: no config.json (not a checkpoint directory)")
    if Path(args.out).resolve() == target.resolve():
        raise ValueError("--out must differ from --target (the draft is its own directory)")
    cfg = ModelConfig.from_hf(target)
    mask_id, mask_name = args.mask_token_id, None
    if mask_id is None:
        tok = Tokenizer.from_dir_optional(target)
        mask_id = tok.token_id(MASK_TOKEN) if tok is not None else None
        if mask_id is None:
            raise ValueError(f"{target}: no {MASK_TOKEN} token in a tokenizer.json; pass "
                             "--mask-token-id")
        mask_name = MASK_TOKEN
    if not 0 <= mask_id < cfg.vocab_size:
        raise ValueError(f"--mask-token-id {mask_id} is outside the target vocab "
                         f"(0..{cfg.vocab_size - 1})")
    out = write_random_draft(cfg, args.out, seed=args.seed, mask_token=mask_name,
                             block_size=args.block_size, num_layers=args.draft_layers,
                             mask_token_id=mask_id)
    print(json.dumps({"draft": str(out), "algorithm": args.draft, "target": str(target),
                      "block_size": args.block_size, "draft_layers": args.draft_layers,
                      "mask_token_id": mask_id}))
    return 0
