"""The corpus split, the committed evaluation text and the trained tokenizer."""

from __future__ import annotations

import hashlib

from tokenizers import Tokenizer

from glmlab import presets
from glmlab.train import corpus
from glmlab.train.tokenizer import TOKENIZER_FILE, check_specials


def test_manifest_follows_the_path_hash_rule_and_pins_the_eval_text():
    files = corpus.read_manifest()
    assert len({f.path for f in files}) == len(files) > 1000
    for f in files:  # the split is a function of the path alone
        bucket = int.from_bytes(hashlib.sha256(f.path.encode()).digest()[:8], "big") % 1000
        assert f.split == ("val" if bucket < 10 else "test" if bucket < 20 else "train")
        assert corpus.split_of(f.path) == f.split
    for split in ("val", "test"):
        paths = corpus.split_files(split)  # raises if a committed file differs from its hash
        assert len(paths) == sum(f.split == split for f in files) > 5


def test_this_interpreter_agrees_with_the_manifest_where_its_files_are_unchanged():
    pinned = {f.path: f for f in corpus.read_manifest()}
    scanned = corpus.scan()
    same = [f for f in scanned if f.path in pinned and pinned[f.path].sha256 == f.sha256]
    assert same and all(f.num_bytes == pinned[f.path].num_bytes for f in same)
    # a path keeps its split whatever the version changed inside the file
    assert all(f.split == pinned[f.path].split for f in scanned if f.path in pinned)


def test_tokenizer_round_trips_the_eval_text_and_has_the_small_preset_ids():
    tok = Tokenizer.from_file(str(corpus.CORPUS_DIR / TOKENIZER_FILE))
    check_specials(tok)
    assert tok.get_vocab_size() == presets.SMALL_VOCAB
    for path in corpus.split_files("val")[:5] + corpus.split_files("test")[:5]:
        text = corpus.read_text(path)
        assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text
    # code merges: indentation and keywords are single tokens, not bytes
    ids = tok.encode("\n    def f(self):\n        return self", add_special_tokens=False).ids
    assert len(ids) <= 12
