"""glmlab init-checkpoint --draft dflash2: a random DFlash2 draft for a target, usable as it is."""

from __future__ import annotations

import json

import pytest
import torch

from glmlab.checkpoint.loader import load_model
from glmlab.cli import main
from glmlab.config import ModelConfig
from glmlab.core import SamplingParams
from glmlab.model.session import Session
from glmlab.speculative.dflash_io import MASK_TOKEN, load_draft
from glmlab.tokenizer import Tokenizer


def _run(capsys, *args: str) -> dict:
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_draft_for_a_target_loads_and_speculation_keeps_the_targets_tokens(tiny_dir, tmp_path,
                                                                            capsys):
    draft = tmp_path / "draft"
    info = _run(capsys, "init-checkpoint", "--draft", "dflash2", "--target", str(tiny_dir),
                "--out", str(draft), "--block-size", "6", "--draft-layers", "1")
    target_cfg = ModelConfig.from_hf(tiny_dir)
    model = load_draft(draft, target_cfg, dtype=torch.float32)
    assert model.cfg.block_size == 6 and model.cfg.num_layers == 1
    assert model.cfg.mask_token_id == Tokenizer.from_dir(tiny_dir).token_id(MASK_TOKEN)
    assert info["mask_token_id"] == model.cfg.mask_token_id
    # the MTP layer stays in the target: the draft is a directory of its own
    assert not (tiny_dir / "model.safetensors").samefile(draft / "model.safetensors")

    got = _run(capsys, "generate", "--model", str(tiny_dir), "--prompt-ids", "4,5,6",
               "--max-new-tokens", "5", "--ignore-eos", "--json", "--speculative", "dflash2",
               "--speculative-draft-path", str(draft), "--speculative-block-size", "6")
    ref = Session(load_model(tiny_dir, dtype=torch.float32), max_len=16).generate(
        0, [4, 5, 6], SamplingParams(max_new_tokens=5, ignore_eos=True))
    assert got["output_ids"] == ref
    assert got["speculative"]["cycles"] >= 1


@pytest.mark.parametrize("args, message", [
    pytest.param(("--draft", "dflash2"), "needs --target", id="no-target"),
    pytest.param(("--target", "X"), "add --draft", id="target-without-draft"),
    pytest.param(("--draft", "dflash2", "--target", "NOPE"), "no config.json", id="not-a-ckpt"),
])
def test_draft_arguments_are_checked(tmp_path, capsys, args, message):
    args = tuple(str(tmp_path / a) if a == "NOPE" else a for a in args)
    assert main(["init-checkpoint", "--out", str(tmp_path / "d"), *args]) == 2
    assert message in capsys.readouterr().err


def test_mask_token_id_outside_the_vocab_is_refused(tiny_dir, tmp_path, capsys):
    assert main(["init-checkpoint", "--draft", "dflash2", "--target", str(tiny_dir), "--out",
                 str(tmp_path / "d"), "--mask-token-id", "100000"]) == 2
    assert "outside the target vocab" in capsys.readouterr().err
