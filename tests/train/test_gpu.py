"""On a GPU: the training forward through fla's chunk_kda (forward and backward) agrees with the
torch reference path, in fp32 and for one bf16 step of the small preset's shapes."""

from __future__ import annotations

import pytest
import torch

from glmlab.model.backends import Backends
from glmlab.train.configs import model_config
from glmlab.train.forward import LossWeights, training_losses
from glmlab.train.init import trainable_parameters
from glmlab.train.trainer import build_model

pytestmark = pytest.mark.gpu


def _losses_and_grads(model, tokens):
    params = trainable_parameters(model)
    losses = training_losses(model, tokens, LossWeights(mtp_depth=2))
    grads = torch.autograd.grad(losses["total"], [p for _, p in params], allow_unused=True)
    return {k: float(v.detach()) for k, v in losses.items()}, dict(zip(
        [n for n, _ in params], grads, strict=True))


def test_fla_kda_training_matches_the_torch_reference():
    model = build_model(model_config("micro"), torch.device("cuda"), torch.float32, "torch", 0)
    tokens = torch.randint(0, 4096, (2, 66), device="cuda",
                           generator=torch.Generator("cuda").manual_seed(0))
    ref, ref_grads = _losses_and_grads(model, tokens)
    fla, fla_grads = _losses_and_grads(model.use_backends(Backends(kda="fla")), tokens)
    for k in ref:
        assert fla[k] == pytest.approx(ref[k], rel=1e-3), k
    for name, g in ref_grads.items():
        if g is None:
            continue
        cos = torch.nn.functional.cosine_similarity(g.flatten(), fla_grads[name].flatten(), 0)
        assert cos > 0.999, name


def test_a_bf16_step_of_the_small_preset_is_finite():
    model = build_model(model_config("small"), torch.device("cuda"), torch.bfloat16, "fla", 0)
    tokens = torch.randint(0, 4096, (2, 514), device="cuda")
    losses, grads = _losses_and_grads(model, tokens)
    assert all(v == v for v in losses.values())
    assert all(torch.isfinite(g).all() for g in grads.values() if g is not None)
