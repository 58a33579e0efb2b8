"""Triton pack / unpack of FP8 MoE activation packets (spec: ``packet_ref.py``).

Both kernels move 4-byte words only: FP8 values, fp32 scales and weights travel as int32
bit-views. No float8 value is ever converted inside a kernel, so the kernels are bitwise equal to
the reference on the GPU and under the CPU interpreter alike (whose fp32 -> e4m3 cast is
approximate, docs/platform.md section 2.1).

- ``pack_triton``: one program per token writes its whole packet (values, scales, weights, ids,
  zero padding) in one pass.
- ``unpack_grouped_triton``: one program per gathered token reads its packet once per chunk of
  value words and writes it to every grouped row ``dest`` assigns it (one per top-k slot that
  routes to this rank's experts), with the row's scales, top-k weight and token index: the
  contiguous grouped-GEMM layout, no intermediate [T, D] tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmlab.kernels.fp8.packet_ref import GroupedRows, PacketLayout, _words


@triton.jit
def _pack_kernel(values_ptr, scales_ptr, weights_ptr, ids_ptr, out_ptr,
                 NV: tl.constexpr, G: tl.constexpr, A: tl.constexpr, W: tl.constexpr,
                 BLOCK: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_A: tl.constexpr,
                 BLOCK_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    row = out_ptr + t * W
    for start in range(0, NV, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < NV
        tl.store(row + offs, tl.load(values_ptr + t * NV + offs, mask=m), mask=m)
    og = tl.arange(0, BLOCK_G)
    mg = og < G
    tl.store(row + NV + og, tl.load(scales_ptr + t * G + og, mask=mg), mask=mg)
    oa = tl.arange(0, BLOCK_A)
    ma = oa < A
    tl.store(row + NV + G + oa, tl.load(weights_ptr + t * A + oa, mask=ma), mask=ma)
    tl.store(row + NV + G + A + oa, tl.load(ids_ptr + t * A + oa, mask=ma), mask=ma)
    op = NV + G + 2 * A + tl.arange(0, BLOCK_PAD)
    tl.store(row + op, tl.zeros([BLOCK_PAD], dtype=tl.int32), mask=op < W)


@triton.jit
def _unpack_grouped_kernel(packets_ptr, dest_ptr, values_ptr, scales_ptr, weights_ptr,
                           tokens_ptr, NV: tl.constexpr, G: tl.constexpr, A: tl.constexpr,
                           W: tl.constexpr, BLOCK: tl.constexpr, BLOCK_G: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    row = packets_ptr + t * W
    for start in range(0, NV, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < NV
        v = tl.load(row + offs, mask=m)
        for a in tl.static_range(A):
            d = tl.load(dest_ptr + t * A + a).to(tl.int64)
            tl.store(values_ptr + tl.maximum(d, 0) * NV + offs, v, mask=m & (d >= 0))
    og = tl.arange(0, BLOCK_G)
    mg = og < G
    s = tl.load(row + NV + og, mask=mg)
    for a in tl.static_range(A):
        d = tl.load(dest_ptr + t * A + a).to(tl.int64)
        dd = tl.maximum(d, 0)
        tl.store(scales_ptr + dd * G + og, s, mask=mg & (d >= 0))
        tl.store(weights_ptr + dd, tl.load(row + NV + G + a), mask=d >= 0)
        tl.store(tokens_ptr + dd, t, mask=d >= 0)


def _block(n: int, cap: int = 1024) -> int:
    return min(triton.next_power_of_2(max(n, 1)), cap)


def pack_triton(layout: PacketLayout, values: torch.Tensor, scales: torch.Tensor,
                weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Same contract as ``pack_ref``: [T, D] fp8, [T, G] fp32, [T, A] fp32, [T, A] int ->
    [T, layout.words] int32 packets."""
    t = values.shape[0]
    out = torch.empty(t, layout.words, dtype=torch.int32, device=values.device)
    if t == 0:
        return out
    nv, g, a = layout.scales_at, layout.num_groups, layout.top_k
    pad = layout.words - layout.ids_at - a
    _pack_kernel[(t,)](_words(values), _words(scales.float()), _words(weights.float()),
                       ids.to(torch.int32).contiguous(), out, NV=nv, G=g, A=a, W=layout.words,
                       BLOCK=_block(nv), BLOCK_G=_block(g), BLOCK_A=_block(a),
                       BLOCK_PAD=_block(pad))
    return out


def unpack_grouped_triton(layout: PacketLayout, packets: torch.Tensor, dest: torch.Tensor,
                          cu_expert_rows: torch.Tensor) -> GroupedRows:
    """Same contract as ``unpack_grouped_ref``: gathered packets [T, words] and ``dest`` [T, A]
    from ``grouped_destinations`` -> ``GroupedRows`` with FP8 values."""
    t = packets.shape[0]
    m = int(cu_expert_rows[-1])
    dev = packets.device
    nv, g = layout.scales_at, layout.num_groups
    values = torch.empty(m, nv, dtype=torch.int32, device=dev)
    scales = torch.empty(m, g, dtype=torch.int32, device=dev)
    weights = torch.empty(m, dtype=torch.int32, device=dev)
    tokens = torch.empty(m, dtype=torch.int64, device=dev)
    if t and m:
        _unpack_grouped_kernel[(t,)](packets.contiguous(), dest.to(torch.int32).contiguous(),
                                     values, scales, weights, tokens, NV=nv, G=g,
                                     A=layout.top_k, W=layout.words, BLOCK=_block(nv),
                                     BLOCK_G=_block(g))
    fp8 = values.view(torch.uint8).view(torch.float8_e4m3fn)
    return GroupedRows(fp8, scales.view(torch.float32), weights.view(torch.float32), tokens,
                       cu_expert_rows)
