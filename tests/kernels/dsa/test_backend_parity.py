"""The ``tilelang`` SPARSE_MLA backend gives the model the same logits as the ``torch`` backend.

The tiny model runs in fp32 on the GPU with a bf16 or FP8 (scaled, 36-byte rows at rank 32)
latent cache, so the two backends read identical cached bytes and differ only by the kernel's bf16
rounding of the queries and probabilities. Prefill of two sequences (one past the indexer's top-k,
so it selects sparsely) then two decode steps.
"""

from __future__ import annotations

import pytest
import torch

from glmlab import presets
from glmlab.cache.storage import CacheDtypes
from glmlab.checkpoint.writer import init_random_
from glmlab.config import ModelConfig
from glmlab.model.backends import SPARSE_MLA, Backends
from glmlab.model.glm import GLM5Model
from glmlab.model.session import Session
from glmlab.testing.compare import assert_close
from glmlab.testing.parity import prompt_ids


def test_tilelang_backend_is_registered():
    assert "tilelang" in SPARSE_MLA.names()


def _logits(model, backend, latent):
    model.use_backends(Backends(sparse_mla=backend))
    dtypes = CacheDtypes(latent=latent, pool_keys=torch.float32, conv=torch.float32)
    s = Session(model, num_seqs=2, max_len=64, dtypes=dtypes)
    out = s.logits({0: prompt_ids(40, 1), 1: prompt_ids(7, 2)})
    for token in (11, 12):
        out += s.logits({0: [token], 1: [token + 1]})
    return torch.cat(out)


@pytest.mark.gpu
@pytest.mark.parametrize("latent", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_tilelang_backend_matches_torch(latent):
    cfg = ModelConfig.from_hf(presets.tiny())
    model = init_random_(GLM5Model(cfg).cuda(), seed=0).float()
    ref = _logits(model, "torch", latent)
    out = _logits(model, "tilelang", latent)
    assert_close("tiny logits, tilelang vs torch backend", ref, out, "bf16")
    assert (ref.argmax(-1) == out.argmax(-1)).float().mean() > 0.95
