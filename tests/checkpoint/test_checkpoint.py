"""Checkpoint I/O: the published layout round-trips, variants load, broken ones fail clearly."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from glmlab import presets
from glmlab.checkpoint import CheckpointError, load_model, save_checkpoint, write_random_checkpoint
from glmlab.model.session import Session
from glmlab.testing.oracle import hf_logits, load_hf_model
from glmlab.testing.parity import prompt_ids

P = "model.language_model."


def _logits(path, ids, dtype=torch.float32, **kw):
    return Session(load_model(path, dtype=dtype, **kw), max_len=64).logits({0: ids})[0]


def _rewrite(src, dst, edit):
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_layout_names_and_dtypes(tiny_dir):
    names = load_file(str(tiny_dir / "model.safetensors"))
    cfg = presets.preset_config("tiny")
    mtp = cfg.mtp_layer
    assert f"{P}embed_tokens.weight" in names and "lm_head.weight" in names
    assert f"{P}layers.0.hc_attn_fn" in names and f"{P}layers.0.self_attn.q_conv1d.weight" in names
    assert f"{P}layers.1.mlp.experts.7.down_proj.weight" in names
    assert f"{P}layers.{mtp}.eh_proj.weight" in names and f"{P}layers.{mtp}.enorm.weight" in names
    assert names[f"{P}layers.0.self_attn.A_log"].dtype == torch.float32
    assert names[f"{P}layers.0.hc_ffn_scale"].dtype == torch.float32
    assert names[f"{P}layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tiny_dir / f).is_file()


def test_sharded_checkpoint_loads_identically(tiny_dir, tmp_path):
    model = load_model(tiny_dir, dtype=torch.float32)
    sharded = save_checkpoint(model, model.cfg, tmp_path / "sharded", max_shard_bytes=64 << 10)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 3
    ids = prompt_ids(20, 1)
    assert torch.equal(_logits(tiny_dir, ids), _logits(sharded, ids))


def test_fp8_layout_matches_dequantised_twin_and_transformers(tmp_path):
    fp8 = write_random_checkpoint(presets.tiny(), tmp_path / "fp8", seed=1, fp8=True)
    stored = load_file(str(fp8 / "model.safetensors"))
    assert stored[f"{P}layers.3.self_attn.q_a_proj.weight"].dtype == torch.float8_e4m3fn
    assert f"{P}layers.3.self_attn.q_a_proj.weight_scale_inv" in stored
    assert stored[f"{P}layers.3.self_attn.kv_b_proj.weight"].dtype == torch.bfloat16
    assert stored[f"{P}layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16  # KDA stays bf16
    assert stored[f"{P}layers.1.mlp.experts.0.gate_proj.weight"].dtype == torch.float8_e4m3fn
    model = load_model(fp8, dtype=torch.bfloat16)
    twin = save_checkpoint(model, model.cfg, tmp_path / "twin", fp8=False)
    ids = prompt_ids(30, 2)
    ours = _logits(fp8, ids, torch.bfloat16)
    assert torch.equal(ours, _logits(twin, ids, torch.bfloat16))
    theirs = hf_logits(load_hf_model(fp8, dtype=torch.bfloat16), ids[:12])
    ours12 = _logits(fp8, ids[:12], torch.bfloat16)
    assert (ours12 - theirs).norm() / theirs.norm() < 0.06


def test_fp8_keep_equals_dequantize(tmp_path):
    cfg = presets.tiny(fp8=True)
    cfg["text_config"]["moe_intermediate_size"] = 128  # keep stacks gate|up: needs whole blocks
    path = write_random_checkpoint(cfg, tmp_path / "fp8", seed=2, fp8=True)
    kept = load_model(path, dtype=torch.bfloat16, fp8="keep")
    assert kept.layers[1].mlp.experts.w13.dtype == torch.float8_e4m3fn
    assert kept.layers[3].self_attn.q_a_proj.is_fp8
    ids = prompt_ids(20, 3)
    assert torch.equal(
        _logits(path, ids, torch.bfloat16), Session(kept, max_len=32).logits({0: ids})[0]
    )


def test_transformers_save_pretrained_loads(tmp_path):
    """A checkpoint written by transformers (fp32-kept tensors in fp32, its own initialisation)."""
    from glmlab.testing.oracle import _import_modeling_without_fla

    mod = _import_modeling_without_fla()
    from transformers import Glm5NextConfig

    tiny = presets.tiny()
    config = Glm5NextConfig(text_config=tiny["text_config"], vision_config=tiny["vision_config"])
    torch.manual_seed(0)
    hf = mod.Glm5NextForConditionalGeneration(config).float().eval()
    with torch.no_grad():  # its init leaves these constant: make every path non-trivial
        for name, p in hf.named_parameters():
            if name.endswith(("A_log", "base", "e_score_correction_bias", "compress_ape")):
                p.normal_(0, 0.3)
            elif name.endswith("compress_gate"):
                p.normal_(0, 0.1)
    hf.save_pretrained(tmp_path / "hf")
    ids = prompt_ids(40, 4)
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    ours = _logits(tmp_path / "hf", ids, with_mtp=False)
    assert (ours - theirs).abs().max() < 1e-5 * theirs.abs().max()


def test_vision_tensors_are_ignored_and_text_only_prefix_loads(tiny_dir, tmp_path):
    extra = _rewrite(
        tiny_dir,
        tmp_path / "mm",
        lambda t: t.update({"model.visual.blocks.0.attn.qkv.weight": torch.zeros(4, 4)}),
    )
    ids = prompt_ids(10, 5)
    assert torch.equal(_logits(tiny_dir, ids), _logits(extra, ids))
    flat = _rewrite(
        tiny_dir,
        tmp_path / "flat",
        lambda t: t.update(
            {k.replace(P, "model.", 1): t.pop(k) for k in list(t) if k.startswith(P)}
        ),
    )
    assert torch.equal(_logits(tiny_dir, ids), _logits(flat, ids))


def _drop(name):
    return lambda t: t.pop(name)


def _reshape(name):
    return lambda t: t.update({name: torch.zeros(3, 3, dtype=torch.bfloat16)})


def _retype(name):
    return lambda t: t.update({name: t[name].to(torch.int32)})


def _fp8_without_scale(name):
    return lambda t: t.update({name: t[name].to(torch.float8_e4m3fn)})


def _extra(name):
    return lambda t: t.update({name: torch.zeros(2, dtype=torch.bfloat16)})


@pytest.mark.parametrize(
    "edit, message",
    [
        pytest.param(
            _drop(f"{P}layers.3.self_attn.kv_b_proj.weight"),
            "missing tensors for layers.3.self_attn.kv_b_proj.weight",
            id="missing",
        ),
        pytest.param(
            _drop(f"{P}layers.2.mlp.experts.5.up_proj.weight"),
            "expert 5 up_proj",
            id="missing-expert",
        ),
        pytest.param(
            _reshape(f"{P}layers.0.self_attn.b_proj.weight"),
            r"layers.0.self_attn.b_proj.weight has shape \[3, 3\]",
            id="shape",
        ),
        pytest.param(_retype(f"{P}norm.weight"), "norm.weight has dtype I32", id="dtype"),
        pytest.param(
            _fp8_without_scale(f"{P}layers.3.self_attn.q_a_proj.weight"),
            "q_a_proj.weight has no .*weight_scale_inv",
            id="fp8-no-scale",
        ),
        pytest.param(
            _fp8_without_scale(f"{P}layers.0.input_layernorm.weight"),
            "input_layernorm.weight is FP8",
            id="fp8-where-not-allowed",
        ),
        pytest.param(
            _extra(f"{P}layers.0.self_attn.mystery.weight"), "unexpected tensors", id="extra"
        ),
    ],
)
def test_broken_checkpoints_name_the_tensor(tiny_dir, tmp_path, edit, message):
    broken = _rewrite(tiny_dir, tmp_path / "broken", edit)
    with pytest.raises(CheckpointError, match=message):
        load_model(broken)


def test_corrupt_and_missing_files(tiny_dir, tmp_path):
    trunc = tmp_path / "trunc"
    shutil.copytree(tiny_dir, trunc)
    data = (trunc / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(trunc)
    (trunc / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="cannot read"):
        load_model(trunc)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((tiny_dir / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_model(empty)
    model = load_model(tiny_dir)
    sharded = save_checkpoint(model, model.cfg, tmp_path / "sharded", max_shard_bytes=64 << 10)
    next(sharded.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="shard model-00002.* is missing"):
        load_model(sharded)


def test_writer_is_deterministic(tmp_path):
    a = write_random_checkpoint(presets.tiny(), tmp_path / "a", seed=3)
    b = write_random_checkpoint(presets.tiny(), tmp_path / "b", seed=3)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_tokenizer_files_for_real_vocab_end_ids(tmp_path):
    """A real-width preset keeps the release's end ids (beyond the byte tokenizer's range)."""
    from glmlab.checkpoint.tokenizer import write_tokenizer_files
    from glmlab.tokenizer import Tokenizer

    write_tokenizer_files(tmp_path, [154820, 154827, 154829], 154820)
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.eos_token_ids == (154820, 154827, 154829)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == (
        "<|endoftext|>")
