"""The two stable CLI interfaces, run as real subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.presets_dir import preset_tag
from glmlab.core import SamplingParams
from glmlab.model.session import Session


def _glmlab(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "glmlab.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_init_checkpoint_then_generate_json(tmp_path):
    out = tmp_path / "ckpt"
    r = _glmlab("init-checkpoint", "--preset", "tiny", "--out", str(out), "--seed", "4")
    assert r.returncode == 0, r.stderr
    r = _glmlab(
        "generate",
        "--model",
        str(out),
        "--prompt-ids",
        "5,6,7,8,9",
        "--max-new-tokens",
        "6",
        "--ignore-eos",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    ref = Session(load_model(out, dtype=torch.float32), max_len=16).generate(
        0, [5, 6, 7, 8, 9], SamplingParams(max_new_tokens=6, ignore_eos=True)
    )
    assert got["output_ids"] == ref and isinstance(got["text"], str)


def test_generate_text_prompt_with_sampling_is_seeded(tiny_dir):
    args = (
        "generate",
        "--model",
        str(tiny_dir),
        "--prompt",
        "Hi there",
        "--max-new-tokens",
        "5",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--seed",
        "7",
        "--ignore-eos",
        "--json",
    )
    a, b = _glmlab(*args), _glmlab(*args)
    assert a.returncode == 0, a.stderr
    assert json.loads(a.stdout)["output_ids"] == json.loads(b.stdout)["output_ids"]


def test_preset_name_is_written_once(tmp_path):
    env = {"GLMLAB_CACHE_DIR": str(tmp_path)}
    r = _glmlab(
        "generate", "--model", "tiny", "--prompt", "x", "--max-new-tokens", "2", "--json", env=env
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "checkpoints" / preset_tag("tiny") / "config.json").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(("--prompt-ids", "1,x"), "comma-separated integers", id="bad-ids"),
        pytest.param(("--prompt-ids", "99999"), "99999", id="oov"),
        pytest.param(("--prompt", ""), "empty", id="empty"),
        pytest.param(("--prompt", "x", "--temperature", "-1"), "temperature", id="temperature"),
        pytest.param(("--prompt", "x", "--top-p", "0"), "top_p", id="top-p"),
        pytest.param(("--prompt", "x", "--max-new-tokens", "0"), "max_new_tokens", id="max-new"),
    ],
)
def test_bad_input_is_a_clear_error(tiny_dir, args, message):
    r = _glmlab("generate", "--model", str(tiny_dir), *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    r = _glmlab("generate", "--model", str(tmp_path / "nope"), "--prompt", "x")
    assert r.returncode == 2 and "neither a checkpoint directory nor a preset" in r.stderr


def test_prompt_ids_need_no_tokenizer(tiny_dir, tmp_path):
    bare = tmp_path / "bare"  # a checkpoint as a bare save_pretrained leaves it: no tokenizer
    shutil.copytree(tiny_dir, bare)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bare / name).unlink()
    r = _glmlab("generate", "--model", str(bare), "--prompt-ids", "5,6,7", "--max-new-tokens",
                "4", "--ignore-eos", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    ref = Session(load_model(bare, dtype=torch.float32), max_len=8).generate(
        0, [5, 6, 7], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert got == {"output_ids": ref, "text": None}
    r = _glmlab("generate", "--model", str(bare), "--prompt", "hi", "--max-new-tokens", "2")
    assert r.returncode == 2 and "tokenizer.json" in r.stderr
