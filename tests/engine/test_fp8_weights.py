"""``Engine.from_pretrained`` loads a block-FP8 checkpoint as the config says: E4M3 weights kept
for the kernels (``fp8_weights=keep``) or widened for the reference, the same greedy tokens
either way (the torch reference dequantises kept weights exactly as the loader does), backends
bound once by the runner."""

from __future__ import annotations

import pytest
import torch

from glmlab import presets
from glmlab.checkpoint.writer import write_random_checkpoint
from glmlab.core import SamplingParams
from glmlab.engine.config import EngineConfig
from glmlab.engine.engine import Engine
from glmlab.model.backends import Backends
from glmlab.testing.parity import prompt_ids


@pytest.fixture(scope="module")
def fp8_path(tmp_path_factory):
    cfg = presets.tiny(fp8=True)
    cfg["text_config"]["moe_intermediate_size"] = 128  # keep stacks gate|up: needs whole blocks
    return write_random_checkpoint(cfg, tmp_path_factory.mktemp("fp8"), seed=2, fp8=True)


def test_kept_and_dequantised_fp8_weights_give_the_same_tokens(fp8_path):
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    outs = {}
    for mode in ("keep", "dequantize"):
        cfg = EngineConfig(dtype="bf16", fp8_weights=mode, context_len=128, print_budget=False,
                           backends=Backends())
        engine = Engine.from_pretrained(fp8_path, cfg)
        w13 = engine.model.layers[1].mlp.experts.w13
        assert (w13.dtype == torch.float8_e4m3fn) == (mode == "keep")
        assert engine.model.backends == cfg.backends and engine.model.dtype == torch.bfloat16
        rid = engine.add_request(prompt_ids(20, 3), params)
        while engine.has_work:
            engine.step()
        outs[mode] = engine.request(rid).output_ids
        assert engine.describe()["fp8_weights"] == mode
    assert outs["keep"] == outs["dequantize"] and len(outs["keep"]) == 6
