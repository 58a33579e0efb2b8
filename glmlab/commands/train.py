"""glmlab train: the stdlib corpus and tokenizer, a model with its MTP layer, a DFlash2 draft.

    glmlab train corpus                          # data/corpus: manifest, val/test text, tokenizer
    glmlab train model --preset small --out data/checkpoints/small --device cuda \\
        --time-budget-s 300 [--with-draft --draft-time-budget-s 90]
    glmlab train draft --target data/checkpoints/small --device cuda --time-budget-s 90

Flags are the fields of ``glmlab.train.trainer.TrainConfig`` / ``glmlab.train.draft.
DraftTrainConfig``; a draft trained with ``--with-draft`` goes to ``<out>/dflash2``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from glmlab.cliargs import add_dataclass_args, dataclass_from_args
from glmlab.train.draft import DraftTrainConfig

HELP = "train the stdlib corpus tokenizer, a model with its MTP layer, or a DFlash2 draft"
_DRAFT_SHARED = ("target", "out", "device", "dtype", "kda_backend", "seed", "max_train_files",
                 "seq_len")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from glmlab.train.trainer import TrainConfig

    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("corpus", help="write data/corpus (manifest, val/test text, tokenizer)")
    c.add_argument("--out", default=None, help="default: data/corpus of the repository")
    c.add_argument("--vocab-size", type=int, default=4096)
    m = sub.add_parser("model", help="train a model and its MTP layer")
    add_dataclass_args(m, TrainConfig)
    m.add_argument("--with-draft", action="store_true", help="then train a DFlash2 draft")
    add_dataclass_args(m, DraftTrainConfig, prefix="draft-", exclude=_DRAFT_SHARED)
    m.add_argument("--quiet", action="store_true", help="no progress bar")
    d = sub.add_parser("draft", help="train a DFlash2 draft for a trained checkpoint")
    add_dataclass_args(d, DraftTrainConfig)
    d.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if args.what == "corpus":
        return _corpus(args)
    from glmlab.train.draft import train_draft

    if args.what == "draft":
        out = train_draft(dataclass_from_args(DraftTrainConfig, args), not args.quiet)
        print(json.dumps({"draft": str(out)}))
        return 0
    from glmlab.train.trainer import TrainConfig, train_target

    cfg = dataclass_from_args(TrainConfig, args)
    out = train_target(cfg, not args.quiet)
    result = {"checkpoint": str(out)}
    if args.with_draft:
        draft = dataclass_from_args(DraftTrainConfig, args, prefix="draft-", target=str(out))
        draft = replace(draft, device=cfg.device, dtype=cfg.dtype, kda_backend=cfg.kda_backend,
                        seed=cfg.seed, max_train_files=cfg.max_train_files, seq_len=cfg.seq_len)
        result["draft"] = str(train_draft(draft, not args.quiet))
    print(json.dumps(result))
    return 0


def _corpus(args: argparse.Namespace) -> int:
    from glmlab.train import corpus
    from glmlab.train.evaluate import byte_unigram_bpb
    from glmlab.train.tokenizer import TOKENIZER_FILE, train_bpe

    out = Path(args.out) if args.out else corpus.CORPUS_DIR
    manifest = corpus.write_corpus(out)
    texts, _ = corpus.train_texts()
    train_bpe(texts, args.vocab_size).save(str(out / TOKENIZER_FILE))
    val = [corpus.read_text(p) for p in corpus.split_files("val", out)]
    counts = {s: sum(f["split"] == s for f in manifest["files"]) for s in corpus.SPLITS}
    print(json.dumps({"corpus": str(out), "python": manifest["python"], "files": counts,
                      "val_byte_unigram_bpb": byte_unigram_bpb(texts, val)}))
    return 0
