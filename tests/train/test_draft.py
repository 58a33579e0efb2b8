"""DFlash2 draft training computes the block the drafter proposes from, and its losses train."""

from __future__ import annotations

import torch

from glmlab.checkpoint.loader import load_model
from glmlab.speculative.dflash import DFlashDraftModel
from glmlab.speculative.dflash_io import init_random_draft_, random_draft_config
from glmlab.speculative.draft_kv import DraftKVLayout, DraftKVStore
from glmlab.train.draft import block_hidden, draft_losses
from glmlab.train.forward import target_forward
from glmlab.train.init import trainable_parameters


def _draft(target, block=4):
    cfg = random_draft_config(target.cfg, block_size=block, num_layers=2,
                              target_layer_ids=(0, 3))
    return init_random_draft_(DFlashDraftModel(cfg), seed=3)


def test_training_blocks_equal_the_drafters_blocks(tiny_dir):
    target = load_model(tiny_dir, dtype=torch.float32)
    draft = _draft(target)
    t, anchors = 24, torch.tensor([5, 11, 17])
    tokens = torch.randint(0, 256, (1, t), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, feats, _ = target_forward(target, tokens, capture_layers=draft.cfg.target_layer_ids)
        feats = torch.cat(feats, dim=-1)
        trained = block_hidden(draft, target.embed_tokens, feats, tokens,
                               torch.zeros(3, dtype=torch.long), anchors, 4)
        # what DFlashDrafter does: context K/V into the store at token slots, then one block
        c = draft.cfg
        kv = DraftKVStore(DraftKVLayout(c.num_layers, c.num_kv_heads, c.head_dim, "bf16"), t)
        pos = torch.arange(t)
        for i, (k, v) in enumerate(draft.context_kv(feats[0], pos)):
            kv.write(i, pos, k, v)
        for j, n in enumerate(anchors.tolist()):
            ids = torch.full((1, 4), c.mask_token_id)
            ids[0, 0] = tokens[0, n]
            served = draft(target.embed_tokens(ids), n + torch.arange(4)[None], kv,
                           torch.arange(n)[None])
            # the store keeps K/V in bf16, training in fp32
            torch.testing.assert_close(trained[j], served[0], rtol=0.02, atol=0.02)


def test_draft_losses_fall_on_a_fixed_batch(tiny_dir):
    target = load_model(tiny_dir, dtype=torch.float32)
    draft = _draft(target, block=8)
    opt = torch.optim.AdamW([p for _, p in trainable_parameters(draft)], lr=3e-3)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    first = None
    for step in range(8):
        gen = torch.Generator().manual_seed(0)  # the same anchors every step
        losses = draft_losses(target, draft, tokens, 8 if step % 2 else 4, 4, 4.0, gen)
        assert torch.isfinite(losses["total"]) and 0 <= float(losses["slot1_acc"]) <= 1
        losses["total"].backward()
        opt.step()
        opt.zero_grad()
        if step == 1:  # block 8 at odd steps: compare like with like
            first = float(losses["draft_ce"].detach())
    assert float(losses["draft_ce"].detach()) < first
    assert not any(p.grad is not None for p in target.parameters())
