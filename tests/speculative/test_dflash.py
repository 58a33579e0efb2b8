"""DFlash2 pieces: draft checkpoints (round trip, clear errors), the selector walk, draft KV."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.checkpoint.store import CheckpointError
from glmlab.checkpoint.tokenizer import TINY_SPECIALS
from glmlab.core import SamplingParams
from glmlab.model.backends import Backends
from glmlab.presets import preset_config
from glmlab.speculative.dflash import DFlashDrafter, DFlashDraftModel, DraftContext
from glmlab.speculative.dflash_config import DraftConfigError, default_target_layers
from glmlab.speculative.dflash_io import (
    init_random_draft_,
    load_draft,
    random_draft_config,
    write_random_draft,
)
from glmlab.speculative.draft_kv import DraftKVLayout, DraftKVStore
from glmlab.speculative.selector import CandidateSelector
from glmlab.speculative.types import SpecRequest
from glmlab.tokenizer import Tokenizer

TINY = preset_config("tiny")


@pytest.fixture()
def draft_dir(tmp_path):
    return write_random_draft(TINY, tmp_path / "draft", block_size=8, selector_top_k=4)


def test_round_trip(draft_dir):
    model = load_draft(draft_dir, TINY, dtype=torch.float32)
    saved = load_file(str(draft_dir / "model.safetensors"))
    assert set(saved) == set(dict(model.named_parameters()))
    for name, p in model.named_parameters():
        assert torch.equal(p, saved[name].float()), name
    cfg = model.cfg
    assert (cfg.block_size, cfg.mask_token_id, cfg.selector_top_k) == (8, 268, 4)
    assert cfg.target_layer_ids == default_target_layers(TINY.num_layers, cfg.num_layers)


def _edit_config(path, **changes):
    raw = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        nested = key in raw["dflash_config"] or key == "mask_token"
        section = raw["dflash_config"] if nested else raw
        if value is None:
            section.pop(key)
        else:
            section[key] = value
    (path / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("changes,message", [
    ({"hidden_size": 32}, "hidden_size"),
    ({"vocab_size": 999}, "vocab_size"),
    ({"target_layer_ids": [0, 9]}, "beyond the target"),
    ({"target_layer_ids": [2, 1]}, "ascending"),
    ({"block_size": 1}, "block_size"),
    ({"mask_token_id": 5000}, "outside the vocab"),
    ({"selector_rank": None}, "selector_rank is missing"),
    ({"model_type": "llama"}, "model_type"),
])
def test_bad_configs_say_what_is_wrong(draft_dir, changes, message):
    _edit_config(draft_dir, **changes)
    with pytest.raises(DraftConfigError, match=message):
        load_draft(draft_dir, TINY)


def test_mask_token_by_name(draft_dir):
    tok = Tokenizer.from_dir(preset_checkpoint("tiny"))
    _edit_config(draft_dir, mask_token_id=None, mask_token="<|mask|>")
    with pytest.raises(DraftConfigError, match="mask token"):
        load_draft(draft_dir, TINY)  # no tokenizer to resolve the name with
    model = load_draft(draft_dir, TINY, tokenizer=tok)
    assert model.cfg.mask_token_id == TINY_SPECIALS["<|mask|>"]
    _edit_config(draft_dir, mask_token="<|nope|>")
    with pytest.raises(DraftConfigError, match="nope"):
        load_draft(draft_dir, TINY, tokenizer=tok)


def test_bad_tensors_are_named(draft_dir):
    file = draft_dir / "model.safetensors"
    tensors = load_file(str(file))
    missing = dict(tensors)
    missing.pop("layers.1.self_attn.k_norm.weight")
    save_file(missing, str(file))
    with pytest.raises(CheckpointError, match="layers.1.self_attn.k_norm.weight"):
        load_draft(draft_dir, TINY)
    save_file({**tensors, "extra.weight": torch.zeros(2)}, str(file))
    with pytest.raises(CheckpointError, match="extra.weight"):
        load_draft(draft_dir, TINY)
    save_file({**tensors, "fc.weight": torch.zeros(3, 3)}, str(file))
    with pytest.raises(CheckpointError, match="fc.weight has shape"):
        load_draft(draft_dir, TINY)
    shutil.rmtree(draft_dir)
    with pytest.raises(DraftConfigError, match="no config.json"):
        load_draft(draft_dir, TINY)


def test_greedy_walk_is_the_best_chain_step_by_step():
    torch.manual_seed(0)
    n, e, k = 3, 4, 5
    cand = torch.stack([torch.randperm(50)[:k] for _ in range(n * e)]).view(n, e, k)
    first, edges = torch.randn(n, k), torch.randn(n, e - 1, k, k)
    tokens, q = CandidateSelector.walk(cand, first, edges, [0.0] * n, [None] * n)
    for i in range(n):
        c = int(first[i].argmax())
        want = [int(cand[i, 0, c])]
        for s in range(1, e):
            c = int(edges[i, s - 1, c].argmax())
            want.append(int(cand[i, s, c]))
        assert tokens[i].tolist() == want
    assert torch.equal(q.sum(-1), torch.ones(n, e)) and bool(((q == 0) | (q == 1)).all())


def test_sampled_walk_returns_the_distributions_it_drew_from():
    torch.manual_seed(1)
    n, e, k = 2, 3, 4
    cand = torch.arange(n * e * k).view(n, e, k)
    first, edges = torch.randn(n, k), torch.randn(n, e - 1, k, k)
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    tokens, q = CandidateSelector.walk(cand, first, edges, [1.0, 0.5], gens)
    assert torch.allclose(q[0, 0], first[0].softmax(-1))
    assert torch.allclose(q[1, 0], (first[1] / 0.5).softmax(-1))
    c0 = int(tokens[0, 0]) % k
    assert torch.allclose(q[0, 1], edges[0, 0, c0].softmax(-1))  # conditioned on the drawn token
    dense = CandidateSelector.dense_proposal(cand, q, n * e * k)
    assert torch.allclose(dense.sum(-1), torch.ones(n, e))


def test_block_attention_is_non_causal_and_reads_the_context():
    cfg = random_draft_config(TINY, block_size=4)
    model = init_random_draft_(DFlashDraftModel(cfg).float())
    kv = DraftKVStore(DraftKVLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, "bf16"), 64)
    feats = torch.randn(10, len(cfg.target_layer_ids) * cfg.hidden_size)
    for i, (k, v) in enumerate(model.context_kv(feats, torch.arange(10))):
        kv.write(i, torch.arange(10), k, v)
    x = torch.randn(1, 4, cfg.hidden_size)
    pos = torch.arange(10, 14)[None]
    ctx = torch.arange(10)[None]
    base = model(x, pos, kv, ctx)
    later = x.clone()
    later[0, 3] += 1.0
    assert not torch.allclose(model(later, pos, kv, ctx)[0, 1], base[0, 1])  # sees later slots
    shorter = model(x, pos, kv, torch.cat([ctx[:, :5], torch.full((1, 5), -1)], 1))
    assert not torch.allclose(shorter[0, 1], base[0, 1])  # sees (all of) its context


def test_fp8_draft_kv_round_trip_and_bytes():
    layout = DraftKVLayout(num_layers=5, kv_heads=8, head_dim=128, dtype="fp8")
    store = DraftKVStore(layout, 16)
    k, v = torch.randn(6, 8, 128), torch.randn(6, 8, 128) * 3
    store.write(2, torch.arange(3, 9), k, v)
    got_k, got_v = store.read(2, torch.arange(3, 9), torch.float32)
    assert float((got_k - k).norm() / k.norm()) < 0.04
    assert float((got_v - v).norm() / v.norm()) < 0.04
    bf16 = DraftKVLayout(5, 8, 128, "bf16").bytes_per_token
    assert (bf16, layout.bytes_per_token) == (20480, 10560)  # FP8 keeps 51.6%


# The two context-attention paths of the draft (dflash.py): "torch" gathers and runs SDPA,
# "triton" reads the store in place (glmlab.kernels.dflash; the CPU interpreter here). Requests
# of different lengths (1 included, one past a 16-row tile) at scattered, permuted slots.
CTX_LENS = [21, 1, 9]


def _draft_with_context(kv_dtype: str, block_size: int = 4, seed: int = 0):
    cfg = random_draft_config(TINY, block_size=block_size)
    model = init_random_draft_(DFlashDraftModel(cfg).float(), seed)
    num_slots = 64
    kv = DraftKVStore(DraftKVLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, kv_dtype),
                      num_slots)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_slots, generator=g)
    slots = torch.full((len(CTX_LENS), max(CTX_LENS)), -1)
    for i, n in enumerate(CTX_LENS):
        slots[i, :n] = perm[i * 24:i * 24 + n]
        feats = torch.randn(n, len(cfg.target_layer_ids) * cfg.hidden_size, generator=g)
        for layer, (k, v) in enumerate(model.context_kv(feats, torch.arange(n))):
            kv.write(layer, slots[i, :n], k, v)
    x = torch.randn(len(CTX_LENS), block_size, cfg.hidden_size, generator=g)
    positions = torch.tensor(CTX_LENS)[:, None] + torch.arange(block_size)
    return model, kv, x, positions, slots, perm


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("block_size", [4, 8])
def test_triton_attention_path_matches_torch_path(kv_dtype, block_size):
    model, kv, x, positions, slots, _ = _draft_with_context(kv_dtype, block_size)
    with torch.inference_mode():
        want = model.use_attention("torch")(x, positions, kv, slots)
        got = model.use_attention("triton")(x, positions, kv, slots)
        ctx = DraftContext(slots.int(), torch.tensor(CTX_LENS, dtype=torch.int32))
        layer = model.layers[0].forward_store(x, positions, kv, 0, ctx, 1 << 20, "triton")
        ref_layer = model.layers[0].forward_store(x, positions, kv, 0, slots, 8, "torch")
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert torch.allclose(layer, ref_layer, rtol=1e-5, atol=1e-5)


def test_attention_impl_is_checked_and_follows_the_target_backends():
    cfg = random_draft_config(TINY, block_size=4)
    model = DFlashDraftModel(cfg)
    assert model.attention == "torch"
    with pytest.raises(ValueError, match="triton"):
        model.use_attention("flash")
    for backends, want in [(Backends.fast(), "triton"), (Backends(), "torch")]:
        target = type("Target", (), {"cfg": TINY, "backends": backends})()
        DFlashDrafter(target, model, layout=None, kv=None)
        assert model.attention == want


class _ScatteredLayout:
    """A layout whose requests' token slots are a fixed permutation of the store."""

    def __init__(self, perm: torch.Tensor):
        self.perm = perm

    def token_slots(self, row: int, start: int, end: int) -> torch.Tensor:
        return self.perm[row * 24 + start:row * 24 + end]


def test_propose_builds_the_context_once_for_the_kernel(tiny_model):
    """``_context_slots``: int32 slots (-1 padded) and int32 lengths; the proposals of the two
    attention paths agree."""
    model, kv, _, _, slots, perm = _draft_with_context("bf16")
    drafter = DFlashDrafter(tiny_model, model, _ScatteredLayout(perm), kv)
    reqs = [SpecRequest(row=i, params=SamplingParams(temperature=0.0), committed=n, anchor=7 + i)
            for i, n in enumerate(CTX_LENS)]
    ctx = drafter._context_slots(reqs)
    assert ctx.slots.dtype == ctx.lens.dtype == torch.int32
    assert torch.equal(ctx.slots, slots.int()) and ctx.lens.tolist() == CTX_LENS
    want = drafter.propose(reqs).tokens  # tiny_model runs the torch backends
    model.use_attention("triton")
    assert torch.equal(drafter.propose(reqs).tokens, want)
