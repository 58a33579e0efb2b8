"""glmlab eval: bits per byte through the engine's runner, checked against a direct computation
with the model, and the engine settings moving it by small, non-zero amounts."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest
import torch

from glmlab.checkpoint.loader import load_model
from glmlab.cli import main
from glmlab.model.session import Session
from glmlab.tokenizer import Tokenizer
from glmlab.train import corpus
from glmlab.train.evaluate import byte_unigram_bpb, file_windows


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    paths = []
    for i, src in enumerate(corpus.split_files("val")[:2]):
        p = out / f"f{i}.py"
        p.write_text(corpus.read_text(src)[:100 + 60 * i])
        paths.append(p)
    return paths


def _eval(*args) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["eval", *args, "--json"]) == 0
    return json.loads(buf.getvalue())


def _direct_bpb(model_dir, files, window):
    model = load_model(model_dir, dtype=torch.float32)
    tok = Tokenizer.from_dir(model_dir)
    nll, n_bytes = 0.0, 0
    for f in files:
        text = f.read_text()
        n_bytes += len(text.encode())
        for w in file_windows(tok, text, window, tok.token_id("<|endoftext|>")):
            logits = Session(model, max_len=window + 64).logits({0: w[:-1]})[0]
            nll += float(torch.nn.functional.cross_entropy(logits, torch.tensor(w[1:]),
                                                           reduction="sum"))
    return nll / math.log(2) / n_bytes


def test_bits_per_byte_equal_a_direct_computation_and_settings_move_them(tiny_dir, files):
    common = ["--model", str(tiny_dir), "--files", *map(str, files), "--window", "48",
              "--chunk", "20", "--batch", "4"]
    ref = _eval(*common)
    assert ref["tokens"] == sum(len(f.read_bytes()) for f in files)  # byte tokenizer: 1 a byte
    assert ref["bytes"] == ref["tokens"] and ref["files"] == 2
    assert ref["bits_per_byte"] == pytest.approx(_direct_bpb(tiny_dir, files, 48), rel=1e-4)
    for flags in (["--kv-dtype", "fp8"], ["--state-dtype", "bf16"], ["--weights", "fp8"]):
        other = _eval(*common, *flags)["bits_per_byte"]
        assert other != ref["bits_per_byte"] and other == pytest.approx(ref["bits_per_byte"],
                                                                        rel=0.05), flags
    dense = _eval(*common, "--attention", "dense")
    assert dense["bits_per_byte"] != ref["bits_per_byte"]  # 48-token windows > top-k 16


def test_byte_unigram_baseline():
    # two equally frequent bytes in training: each costs log2((n + 1) / (2n + 256)) bits
    n = 1000
    got = byte_unigram_bpb(["ab" * (n // 2)], ["abba"])
    assert got == pytest.approx(-math.log2((n // 2 + 1) / (n + 256)))
