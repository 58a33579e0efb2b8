"""A byte-level BPE tokenizer trained on the train split, saved in the published file layout.

HF ``tokenizers`` BPE over the GPT-2 byte alphabet (every byte is a token, so any text round-trips
and bits per byte are exact), with the GPT-2 pre-tokenisation regex and no normaliser. GLM's
special tokens (``glmlab.checkpoint.tokenizer.SPECIAL_TOKENS``, the DFlash2 ``<|mask|>`` among
them) take the first ids, which is what ``glmlab.presets.SMALL_SPECIALS`` assumes; the chat
template is the one every glmlab checkpoint ships. ``write_tokenizer_files`` writes
``tokenizer.json``, ``tokenizer_config.json`` and ``generation_config.json`` into a checkpoint.

It knows nothing about models: vocabulary size and special ids are the caller's to match.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from glmlab.checkpoint.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS
from glmlab.presets import SMALL_SPECIALS

TOKENIZER_FILE = "tokenizer.json"


def train_bpe(texts: list[str], vocab_size: int) -> Tokenizer:
    """BPE with ``vocab_size`` ids in all (specials first, then the 256 bytes, then merges)."""
    floor = len(SPECIAL_TOKENS) + 256
    if vocab_size <= floor:
        raise ValueError(f"vocab_size must exceed {floor} (specials + bytes), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    check_specials(tok)
    return tok


def check_specials(tok: Tokenizer) -> None:
    for name, idx in SMALL_SPECIALS.items():
        if tok.token_to_id(name) != idx:
            raise ValueError(f"special token {name} has id {tok.token_to_id(name)}, the small "
                             f"preset expects {idx}")


def write_tokenizer_files(tokenizer_json: Path, out: Path, eos_ids: list[int],
                          pad_id: int) -> None:
    """Copy a trained ``tokenizer.json`` into checkpoint ``out`` with its config files."""
    check_specials(Tokenizer.from_file(str(tokenizer_json)))
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_json, out / TOKENIZER_FILE)
    names = {i: t for t, i in SMALL_SPECIALS.items()}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": names[eos_ids[0]],
        "pad_token": names[pad_id],
        "model_max_length": 1048576,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True, "normalized": False, "lstrip": False,
                     "rstrip": False, "single_word": False}
            for t, i in SMALL_SPECIALS.items()
        },
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {"eos_token_id": eos_ids, "pad_token_id": pad_id, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
