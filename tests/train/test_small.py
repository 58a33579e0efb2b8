"""The stable interfaces around the trained model: ``--model small``, ``generate --json``'s
"spec" object, and (once the checkpoint is committed) its quality on held-out text."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from glmlab import presets
from glmlab.checkpoint.presets_dir import SMALL_CHECKPOINT, resolve_model
from glmlab.cli import main
from glmlab.train import corpus
from glmlab.train.evaluate import byte_unigram_bpb

TRAINED = (SMALL_CHECKPOINT / "config.json").is_file()


def _cli(*args) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(list(args)) == 0
    return json.loads(buf.getvalue().strip().splitlines()[-1])


def test_generate_json_reports_measured_acceptance(tiny_dir):
    out = _cli("generate", "--model", str(tiny_dir), "--prompt-ids", "5,6,7,8,9,10",
               "--max-new-tokens", "6", "--ignore-eos", "--speculative-algorithm", "mtp",
               "--speculative-num-steps", "2", "--json")
    spec = out["spec"]
    assert spec["cycles"] >= 1 and 1.0 <= spec["accepted_per_cycle"] <= 3.0
    assert spec["accepted_per_cycle"] == out["speculative"]["accept_len"]
    assert not out["speculative"]["simulated"]


def test_small_resolves_to_the_committed_checkpoint():
    if not TRAINED:
        with pytest.raises(FileNotFoundError, match="no trained small checkpoint"):
            resolve_model("small")
        return
    path = resolve_model("small")
    raw = json.loads((path / "config.json").read_text())
    assert raw["text_config"] == presets.small()["text_config"]


@pytest.mark.skipif(not TRAINED, reason="the trained small checkpoint is not committed yet")
def test_small_beats_the_byte_unigram_baseline_on_test_files():
    files = [p for p in corpus.split_files("test") if 2000 < p.stat().st_size < 8000][:2]
    out = _cli("eval", "--model", "small", "--files", *map(str, files), "--window", "256",
               "--chunk", "128", "--json")
    train, _ = corpus.train_texts()
    baseline = byte_unigram_bpb(train, [corpus.read_text(f) for f in files])
    assert out["tokens"] > 100 and out["bits_per_byte"] < 0.6 * baseline
