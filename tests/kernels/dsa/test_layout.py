"""MLA KV byte layouts: sizes, bitwise packing, exact unpacking; the cache writes the same bytes."""

from __future__ import annotations

import struct

import pytest
import torch

from glmlab.kernels.dsa.layout import FP8, FP8_MAX, KVFormat, MlaKVLayout
from glmlab.testing.compare import assert_bitwise_equal


@pytest.mark.parametrize("fmt,rank,bytes_,scales", [
    pytest.param(KVFormat.BF16, 512, 1024, 0, id="bf16-512"),
    pytest.param(KVFormat.FP8_RAW, 512, 512, 0, id="raw-512"),
    pytest.param(KVFormat.FP8_SCALED, 512, 528, 4, id="scaled-512"),
    pytest.param(KVFormat.FP8_SCALED, 32, 36, 1, id="scaled-32-one-group"),
])
def test_sizes(fmt, rank, bytes_, scales):
    lay = MlaKVLayout(fmt, rank)
    assert (lay.bytes_per_token, lay.num_scales) == (bytes_, scales)
    assert lay.empty(3).view(torch.uint8).shape == (3, bytes_)


def test_scaled_bytes_by_hand():
    """Bytes built independently (struct for the scales) equal pack() bit for bit."""
    lay = MlaKVLayout(KVFormat.FP8_SCALED, rank=256)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0))
    x[1, 128:] = 0.0  # an all-zero group: scale 0, values 0
    expected = []
    for row in x:
        vals, scales = [], []
        for g in row.view(2, 128):
            s = float(g.abs().max()) / FP8_MAX
            q = (g / s if s > 0 else g).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            vals.append(q.view(torch.uint8))
            scales.append(struct.pack("<f", s))
        expected.append(torch.cat([*vals, torch.frombuffer(bytearray(b"".join(scales)),
                                                            dtype=torch.uint8)]))
    assert_bitwise_equal("scaled pack", torch.stack(expected), lay.pack(x))


@pytest.mark.parametrize("fmt", list(KVFormat), ids=lambda f: f.value)
def test_unpack_inverts_pack(fmt):
    lay = MlaKVLayout(fmt, 512)
    x = torch.randn(17, 512, generator=torch.Generator().manual_seed(1)) * 3
    rows = lay.pack(x)
    assert lay.matches(rows) and rows.dtype == lay.storage_dtype
    y = lay.unpack(rows)
    if fmt is KVFormat.BF16:
        assert torch.equal(y, x.to(torch.bfloat16).float())
        return
    if fmt is KVFormat.FP8_RAW:
        assert torch.equal(y, x.to(FP8).float())
        return
    # scaled: exact e4m3 x scale, and within e4m3 precision (3 mantissa bits) of the input
    scale = rows[:, 512:].contiguous().view(torch.float32)
    values = rows[:, :512].contiguous().view(FP8).float().view(17, 4, 128)
    assert torch.equal(y, (values * scale[..., None]).flatten(1))
    assert ((y - x).abs() <= x.abs() / 16 + scale.max() * 2**-9).all()
    assert_bitwise_equal("pack(unpack(pack))", rows, lay.pack(y))


def test_raw_saturates_instead_of_nan():
    lay = MlaKVLayout(KVFormat.FP8_RAW, 16)
    y = lay.unpack(lay.pack(torch.tensor([[1000.0, -1e6] + [0.0] * 14])))
    assert y[0, :2].tolist() == [448.0, -448.0]


def test_layout_is_inferred_from_storage():
    for fmt in KVFormat:
        lay = MlaKVLayout(fmt, 32)
        assert MlaKVLayout.of(lay.empty(4), 32) == lay
    with pytest.raises(ValueError, match="no MLA KV layout"):
        MlaKVLayout.of(torch.zeros(4, 32), 32)  # fp32 rows are no serving layout
    with pytest.raises(ValueError):
        MlaKVLayout(KVFormat.FP8_SCALED, 192)  # not a multiple of the 128-channel group


def test_cache_writes_the_kernel_layout():
    """``glmlab.cache`` with an FP8 latent stores exactly MlaKVLayout(FP8_SCALED) rows."""
    from glmlab import presets
    from glmlab.cache.storage import CacheDtypes, ModelCache
    from glmlab.config import ModelConfig

    cfg = ModelConfig.from_hf(presets.tiny())
    cache = ModelCache(cfg, 64, 1, dtypes=CacheDtypes(latent=FP8))
    layer, rank = cfg.dsa_layers[0], cfg.dsa.kv_lora_rank
    lay = MlaKVLayout.of(cache.latent[layer], rank)
    assert lay.format is KVFormat.FP8_SCALED
    c = torch.randn(5, rank, generator=torch.Generator().manual_seed(2))
    slots = torch.tensor([3, 9, 10, 40, 63])
    cache.write_latent(layer, slots, c)
    assert_bitwise_equal("cache rows", lay.pack(c), cache.latent[layer][slots])
    assert torch.equal(cache.read_latent(layer, slots, torch.float32), lay.unpack(lay.pack(c)))
