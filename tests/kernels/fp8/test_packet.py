"""FP8 MoE activation packets: byte layout, pack -> unpack round trip, Triton vs torch bitwise."""

from __future__ import annotations

import pytest
import torch

from glmlab.distributed.fp8_packet import gathered_bytes, transport_bytes
from glmlab.kernels.fp8.packet_ref import (
    PacketLayout,
    dequant_act_fp8,
    grouped_destinations,
    pack_ref,
    split_packets,
    unpack_grouped_ref,
)
from glmlab.kernels.fp8.packet_triton import pack_triton, unpack_grouped_triton
from glmlab.kernels.fp8.ref import quant_act_fp8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _tokens(t: int, d: int, a: int, e: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, d, generator=g) * torch.logspace(-3, 2, t)[:, None]  # wide token scales
    values, scales = quant_act_fp8(x) if t else (x.to(torch.float8_e4m3fn), x.new_zeros(0, 1))
    weights = torch.rand(t, a, generator=g) * 2.5
    ids = torch.stack([torch.randperm(e, generator=g)[:a] for _ in range(t)]) if t else \
        torch.zeros(0, a, dtype=torch.long)
    return [v.to(DEVICE) for v in (values, scales, weights, ids)]


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8)


def test_real_width_byte_accounting():
    b = transport_bytes(4096, 8)
    assert (b["bf16_bytes"], b["packet_bytes"], b["packet_payload_bytes"]) == (8192, 4288, 4288)
    assert b["saving"] == pytest.approx(0.4766, abs=1e-4)  # the seed's "about 47.5%"
    layout = PacketLayout(4096, 8)
    assert [f[1:] for f in layout.fields()] == [(0, 4096), (4096, 128), (4224, 32), (4256, 32)]
    assert gathered_bytes(8191, 2, layout.bytes_per_token) == 8192 * 4288  # one pad row


def test_tiny_layout_is_padded_to_alignment():
    layout = PacketLayout(64, 2)
    assert layout.payload_bytes == 64 + 4 + 8 + 8
    assert layout.bytes_per_token == 96 and layout.fields()[-1] == ("pad", 84, 12)
    with pytest.raises(ValueError):
        PacketLayout(62, 2)


CASES = [
    pytest.param(7, 64, 2, 8, 0, 4, id="T7-D64-A2-E8-local0:4"),
    pytest.param(13, 256, 8, 16, 8, 8, id="T13-D256-A8-E16-local8:16"),
    pytest.param(9, 200, 3, 6, 0, 6, id="T9-D200-A3-all-local-partial-group"),
    pytest.param(5, 64, 2, 8, 6, 2, id="T5-few-local-rows"),
    pytest.param(1, 4096, 8, 288, 144, 144, id="T1-D4096-A8-E288-real-width"),
    pytest.param(0, 64, 2, 8, 0, 4, id="T0-empty"),
]


@pytest.mark.parametrize("t,d,a,e,start,num_local", CASES)
def test_pack_unpack_roundtrip_and_triton_bitwise(t, d, a, e, start, num_local):
    layout = PacketLayout(d, a)
    values, scales, weights, ids = _tokens(t, d, a, e, seed=t + d)
    packets = pack_ref(layout, values, scales, weights, ids)
    assert packets.shape == (t, layout.words) and packets.dtype == torch.int32
    assert torch.equal(pack_triton(layout, values, scales, weights, ids), packets)
    v, s, w, i = split_packets(layout, packets)
    assert torch.equal(_bits(v), _bits(values)) and torch.equal(_bits(s), _bits(scales))
    assert torch.equal(_bits(w), _bits(weights)) and torch.equal(i.long(), ids)

    dest, cu = grouped_destinations(ids, start, num_local)
    ref = unpack_grouped_ref(layout, packets, dest, cu)
    tri = unpack_grouped_triton(layout, packets, dest, cu)
    for name in ("values", "scales", "weights", "tokens"):
        assert torch.equal(_bits(getattr(tri, name)), _bits(getattr(ref, name))), name
    # Every pair routed to a local expert appears once, in expert then token order, unchanged.
    tok, slot = torch.nonzero((ids >= start) & (ids < start + num_local), as_tuple=True)
    assert ref.num_rows == tok.numel() == int(cu[-1])
    counts = torch.bincount(ids[tok, slot] - start, minlength=num_local)
    assert torch.equal(cu.diff(), counts)
    order = torch.argsort((ids[tok, slot] - start) * (t * a) + tok * a + slot)
    assert torch.equal(ref.tokens, tok[order])
    assert torch.equal(_bits(ref.values), _bits(values[tok[order]]))
    assert torch.equal(ref.weights, weights[tok[order], slot[order]])


def test_packet_values_are_reused_not_requantised():
    layout = PacketLayout(256, 2)
    values, scales, weights, ids = _tokens(6, 256, 2, 4, seed=3)
    dest, cu = grouped_destinations(ids, 0, 4)
    rows = unpack_grouped_ref(layout, pack_ref(layout, values, scales, weights, ids), dest, cu)
    x = dequant_act_fp8(rows.values, rows.scales, torch.float32)
    assert torch.equal(x, dequant_act_fp8(values, scales, torch.float32)[rows.tokens])
