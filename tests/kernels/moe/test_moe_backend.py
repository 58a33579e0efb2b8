"""The ``triton`` MOE_EXPERTS backend in the model, against the torch backend and the FP8 recipe.

- tiny (fp32 weights): whole-model logits equal the torch backend's to fp32 rounding.
- tiny with FP8 experts kept as E4M3 (moe_intermediate 128 so the 128-blocks tile the stacks):
  every MoE layer's routed output equals the W8A8 reference exactly (CPU interpreter) and stays
  within activation-quantisation error of the torch backend (weight-only dequantisation);
  whole-model logits equal a model whose experts run the W8A8 reference.
"""

from __future__ import annotations

import pytest
import torch

from glmlab import presets
from glmlab.checkpoint.loader import load_model
from glmlab.checkpoint.writer import write_random_checkpoint
from glmlab.kernels.moe.ref import moe_experts_fp8_ref
from glmlab.model.backends import MOE_EXPERTS, Backends
from glmlab.model.moe import Experts, MoE
from glmlab.model.session import Session

PROMPT = list(range(5, 29))


def _logits(model) -> torch.Tensor:
    return Session(model, num_seqs=1, max_len=64).logits({0: PROMPT})[0]


def test_triton_backend_registered():
    assert "triton" in MOE_EXPERTS.names()


def test_tiny_fp32_logits_match_torch_backend(tmp_path):
    write_random_checkpoint(presets.tiny(), tmp_path, seed=0)
    model = load_model(tmp_path, dtype=torch.float32)
    ref = _logits(model)
    out = _logits(model.use_backends(Backends(moe="triton")))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def fp8_model(tmp_path_factory):
    cfg = presets.tiny(fp8=True)
    cfg["text_config"]["moe_intermediate_size"] = 128
    path = write_random_checkpoint(cfg, tmp_path_factory.mktemp("tiny_fp8"), seed=0, fp8=True)
    model = load_model(path, dtype=torch.bfloat16, fp8="keep")
    assert all(m.is_fp8 for m in model.modules() if isinstance(m, Experts))
    return model


def _w8a8_ref(x, ids, weights, ex):
    return moe_experts_fp8_ref(x, ids, weights, ex.w13, ex.w13_scale, ex.w2, ex.w2_scale,
                               ex.limit, tuple(ex.block))


def test_fp8_layers_match_w8a8_ref_and_torch_backend(fp8_model):
    model = fp8_model.use_backends(Backends(moe="triton"))
    moe = next(m for m in model.modules() if isinstance(m, MoE))  # the layers differ only in data
    x = torch.randn(14, model.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    x = x.to(torch.bfloat16)
    weights, ids = moe.gate(x)
    out = moe.experts(x, ids, weights).float()
    torch.testing.assert_close(out, _w8a8_ref(x, ids, weights, moe.experts).float(),
                               rtol=1e-3, atol=1e-3)
    torch_out = Backends().resolve()["moe_experts"](x, ids, weights, moe.experts).float()
    assert 1e-3 < ((out - torch_out).norm() / torch_out.norm()).item() < 6e-2


def test_fp8_model_logits_match_w8a8_ref_model(fp8_model):
    model = fp8_model.use_backends(Backends(moe="triton"))
    out = _logits(model)
    experts = [m for m in model.modules() if isinstance(m, Experts)]
    for ex in experts:
        ex.op = _w8a8_ref
    try:
        ref = _logits(model)
    finally:
        model.use_backends(Backends(moe="triton"))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
