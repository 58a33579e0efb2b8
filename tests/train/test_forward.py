"""The training forward computes what the serving forward computes, and its losses reach the
parameters they should (the indexer only through its KL, the correction bias never)."""

from __future__ import annotations

import pytest
import torch

from glmlab.checkpoint.loader import load_model
from glmlab.model.plan import ForwardPlan
from glmlab.model.session import Session
from glmlab.train.forward import LossWeights, mtp_forward, target_forward, training_losses
from glmlab.train.init import trainable_parameters


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_model(tiny_dir, dtype=torch.float32)


def test_windows_equal_the_served_forward_with_sparse_selection(tiny):
    b, t = 2, 40  # longer than index_topk (16): the indexer really selects
    assert t > tiny.cfg.dsa.index_topk
    ids = torch.randint(0, 256, (b, t + 1), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden, captured, kls = target_forward(tiny, ids[:, :t], capture_layers=(1,))
        mtp, _ = mtp_forward(tiny, hidden, ids[:, 1:])
        dense, _, _ = target_forward(tiny, ids[:, :t], dense=True)
    session = Session(tiny, num_seqs=b, max_len=64)
    rows = list(range(b))
    plan = ForwardPlan.build([t] * b, [0] * b, rows, session.page_table[rows], session.page_size)
    with torch.inference_mode():
        served, served_feats = tiny(ids[:, :t].flatten(), plan, session.cache, capture_layers=(1,))
        served_mtp = tiny.mtp_forward(served, ids[:, 1:].flatten(), plan, session.cache)
    torch.testing.assert_close(hidden.flatten(0, 1), served, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(captured[0].flatten(0, 1), served_feats[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mtp.flatten(0, 1), served_mtp, rtol=1e-4, atol=1e-4)
    assert (dense - hidden).abs().max() > 1e-2  # selection matters: dense is another model
    assert len(kls) == len(tiny.cfg.dsa_layers) and all(0 <= float(k) < 10 for k in kls)
    assert captured[0].shape == (b, t, tiny.cfg.hidden_size)


def test_indexer_learns_only_from_its_kl_and_the_bias_from_nothing(tiny_dir):
    model = load_model(tiny_dir, dtype=torch.float32)
    trainable_parameters(model)
    tokens = torch.randint(0, 256, (2, 34), generator=torch.Generator().manual_seed(1))
    losses = training_losses(model, tokens, LossWeights(mtp_depth=2))
    assert set(losses) == {"lm", "mtp1", "mtp2", "indexer_kl", "total"}
    named = dict(model.named_parameters())
    idx = [n for n in named if ".indexer." in n]
    rest = [n for n in named if ".indexer." not in n and named[n].requires_grad]
    kl_grads = torch.autograd.grad(losses["indexer_kl"], [named[n] for n in idx + rest],
                                   allow_unused=True)
    assert all(g is not None and g.abs().sum() > 0 for g in kl_grads[:len(idx)])
    assert all(g is None or g.abs().sum() == 0 for g in kl_grads[len(idx):])
    lm = losses["lm"] + losses["mtp1"] + losses["mtp2"]
    lm_grads = torch.autograd.grad(lm, [named[n] for n in idx], allow_unused=True)
    assert all(g is None or g.abs().sum() == 0 for g in lm_grads)
    assert not any(p.requires_grad for n, p in named.items() if "correction_bias" in n)
