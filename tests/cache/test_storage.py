"""Cache storage: FP8 formats (the DSA kernels' byte layouts), draft-KV rows, regions, copies, and
byte counts that agree with the budget's ``CacheFootprint``."""

from __future__ import annotations

import pytest
import torch

from glmlab.cache.footprint import CacheFootprint
from glmlab.cache.storage import CacheDtypes, ModelCache
from glmlab.kernels.dsa.layout import FP8_SCALED_512
from glmlab.kernels.dsa.ref import quantize_pool_keys_ref
from glmlab.presets import preset_config

FP8 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def tiny_cfg():
    return preset_config("tiny")


def test_full_fp8_bytes_per_token_match_the_seed_layout():
    cfg = preset_config("full")
    dt = CacheDtypes(latent=FP8, pool_keys=FP8)
    cache = ModelCache(cfg, 64, 1, dtypes=dt, device="meta", with_mtp=False)
    assert cache.latent[cfg.dsa_layers[0]].shape[1] == FP8_SCALED_512.bytes_per_token == 528
    assert cache.index_bytes_per_token() == 11 * (128 + 4) / 4  # 33 B per token per layer
    assert cache.bytes_per_token() == 11 * 561 == 6171  # docs/model.md section 3
    spec = CacheFootprint.of(cfg, dt, tp=4)
    assert spec.kv_bytes_per_token == 6171  # latent and keys are not sharded by TP
    assert spec.kda_state_bytes_per_slot == 34 * (16 * 128 * 128 * 4 + 3 * 3 * 2048 * 2)


@pytest.mark.parametrize("latent,keys", [
    (FP8, FP8), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
], ids=["fp8", "bf16", "fp32"])
def test_spec_agrees_with_allocated_storage(tiny_cfg, latent, keys):
    dt = CacheDtypes(latent=latent, pool_keys=keys, recurrent=torch.bfloat16)
    cache = ModelCache(tiny_cfg, 128, 3, dtypes=dt, with_mtp=True)
    spec = CacheFootprint.of(tiny_cfg, dt, with_mtp=True)
    assert spec.kv_bytes_per_token == cache.bytes_per_token()
    assert spec.state_bytes_per_slot == cache.state_bytes_per_slot()
    assert spec.num_dsa_layers == 2  # the DSA layer and the MTP layer


def test_fp8_latent_is_quantised_on_write_and_dequantised_on_read(tiny_cfg):
    cache = ModelCache(tiny_cfg, 64, 1, dtypes=CacheDtypes(latent=FP8, pool_keys=FP8))
    layer = tiny_cfg.dsa_layers[0]
    c = torch.randn(5, tiny_cfg.dsa.kv_lora_rank) * torch.tensor([0.01, 1, 30, 0, 2])[:, None]
    slots = torch.tensor([3, 9, 10, 40, 63])
    cache.write_latent(layer, slots, c)
    back = cache.read_latent(layer, slots[None, :], torch.float32)[0]  # [T, W] gathers work too
    scale = c.abs().amax(-1, keepdim=True) / 448
    ref = (c / scale.clamp(min=1e-30)).to(FP8).float() * scale  # e4m3 x scale, one group
    assert torch.equal(back, ref)
    assert torch.equal(back[3], torch.zeros_like(back[3]))  # all-zero row: scale 0, no NaN
    rows = cache.latent[layer][slots]
    assert rows.dtype == torch.uint8 and rows.shape[1] == 32 + 4


def test_fp8_pool_keys_use_one_scale_per_key(tiny_cfg):
    cache = ModelCache(tiny_cfg, 64, 1, dtypes=CacheDtypes(latent=FP8, pool_keys=FP8))
    layer = tiny_cfg.dsa_layers[0]
    keys = torch.randn(3, tiny_cfg.dsa.index_head_dim)
    cache.write_pool_keys(layer, torch.tensor([0, 5, 15]), keys)
    q, s = quantize_pool_keys_ref(keys)
    assert torch.equal(cache.read_pool_keys(layer, torch.tensor([0, 5, 15]), torch.float32),
                       q.float() * s[:, None])
    assert torch.equal(cache.pool_key_scales[layer][torch.tensor([0, 5, 15])], s)


def test_copy_from_moves_whole_pages_and_one_state_slot(tiny_cfg):
    dt = CacheDtypes(latent=FP8, pool_keys=FP8)
    a, b = ModelCache(tiny_cfg, 256, 3, dtypes=dt), ModelCache(tiny_cfg, 256, 3, dtypes=dt)
    for t, _ in a.regions().values():
        t.copy_(torch.randint(0, 100, t.shape).to(t.dtype))
    moved = b.copy_from(a, [2, 0], [1, 3], src_slot=2, dst_slot=1)
    for name, (t, unit) in b.regions().items():
        src = a.regions()[name][0]
        if unit == "state":
            assert torch.equal(t[1], src[2]) and not t[0].any()
        else:
            rows = 64 if unit == "token" else 16
            assert torch.equal(t[rows:2 * rows], src[2 * rows:3 * rows]), name
            assert torch.equal(t[3 * rows:4 * rows], src[:rows]), name
            assert not t[:rows].any() and not t[2 * rows:3 * rows].any()
    per_page = 64 * a.bytes_per_token()
    assert moved == 2 * per_page + a.state_bytes_per_slot()
    with pytest.raises(ValueError, match="layouts differ"):
        ModelCache(tiny_cfg, 256, 3).copy_from(a, [0], [0], 0, 0)
