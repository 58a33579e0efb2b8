"""Full-scale counts printed by code equal docs/model.md (sections 1 and 3)."""

from __future__ import annotations

import torch

from glmlab.cache.storage import CacheDtypes, ModelCache
from glmlab.model.accounting import param_counts
from glmlab.presets import preset_config


def test_full_parameter_counts():
    c = param_counts(preset_config("full"))
    assert c.main == 313_326_811_966
    assert c.mtp == 7_432_592_416
    assert c.total == 320_759_404_382
    assert c.routed_experts == 304_405_807_104
    assert c.active == 17_376_721_726  # ~17.4B: shared weights + 8 of 288 routed experts
    assert c.embed == c.lm_head == 634_388_480


def test_full_state_bytes_per_request():
    cfg = preset_config("full")
    fp32 = ModelCache(
        cfg,
        64,
        1,
        dtypes=CacheDtypes(recurrent=torch.float32, conv=torch.bfloat16),
        device="meta",
        with_mtp=False,
    )
    per_layer_tail = 4 * 2 * 128 * 2  # index tail: kpool rows of (key, gate) in bf16
    kda = 34 * (64 * 128 * 128 * 4 + 3 * 3 * 8192 * 2)
    assert kda == 147_619_840  # docs/model.md: 140.8 MiB
    assert fp32.state_bytes_per_slot() == kda + 11 * per_layer_tail
    bf16 = ModelCache(
        cfg, 64, 1, dtypes=CacheDtypes(recurrent=torch.bfloat16), device="meta", with_mtp=False
    )
    assert bf16.state_bytes_per_slot() - 11 * per_layer_tail == 76_316_672  # 72.8 MiB


def test_full_kv_bytes_per_token_bf16_latent():
    cfg = preset_config("full")
    cache = ModelCache(
        cfg,
        64,
        1,
        dtypes=CacheDtypes(latent=torch.bfloat16, pool_keys=torch.bfloat16),
        device="meta",
        with_mtp=False,
    )
    # 1024 B of bf16 latent + a bf16 128-wide pooled key shared by 4 tokens, per DSA layer
    assert cache.bytes_per_token() == 11 * (1024 + 64)
