"""``ref.race_ref`` in one pass: the seeded exponential-race draw of a temperature-scaled row.

A program walks one row of the fp32 logits in blocks, hashes each token id with the row's seed
and position into its uniform (the same splitmix64 integer steps as ``ref.seeded_uniform``: int64
products wrap in Triton as in torch), keeps the running best of ``x / T - log(-log u)`` and writes
the winning token id. The torch reference materialises the [M, V] int64 hash (a dozen passes of
1.2 GB at M = 128 on the real vocabulary) and a softmax; this reads the logits once (79 MB), which
is what keeps plain temperature sampling a small part of a decode step. Ties go to the lower token
id, as ``argmax`` does. Grid: (M,).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glmlab.kernels.sampling.ref import GOLDEN, MIX1, MIX2


@triton.jit
def _shr(x, n: tl.constexpr):
    return (x >> n) & ((1 << (64 - n)) - 1)


@triton.jit
def _race_kernel(x_ptr, idx_ptr, temp_ptr, seed_ptr, pos_ptr, out_ptr, V, stride_x,
                 golden, mix1, mix2, BV: tl.constexpr):
    i = tl.program_id(0)
    row = tl.load(idx_ptr + i).to(tl.int64)
    temp = tl.load(temp_ptr + i)
    key = tl.load(seed_ptr + i).to(tl.int64) * golden + tl.load(pos_ptr + i).to(tl.int64) * mix2
    best = tl.full([], float("-inf"), tl.float32)
    best_id = tl.zeros([], dtype=tl.int64)
    for start in range(0, V, BV):
        v = start + tl.arange(0, BV)
        ok = v < V
        x = tl.load(x_ptr + row * stride_x + v, mask=ok, other=0.0)
        # IEEE division, as torch's (Triton's ``/`` on fp32 is the approximate one)
        s = tl.math.div_rn(x, temp + tl.zeros_like(x))
        h = key + v.to(tl.int64) * golden
        h = (h ^ _shr(h, 30)) * mix1
        h = (h ^ _shr(h, 27)) * mix2
        h = h ^ _shr(h, 31)
        u = (_shr(h, 40).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
        k = tl.where(ok, s - tl.log(-tl.log(u)), float("-inf"))
        m = tl.max(k, axis=0)
        j = tl.argmax(k, axis=0)
        take = m > best  # strict: an earlier block keeps a tie
        best_id = tl.where(take, start + j.to(tl.int64), best_id)
        best = tl.where(take, m, best)
    tl.store(out_ptr + i, best_id)


def race_triton(x: torch.Tensor, idx: torch.Tensor, temperature: torch.Tensor,
                seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``ref.race_ref``: [M] int64 tokens drawn from rows ``idx`` of fp32 logits ``x`` [N, V]
    (last dim contiguous) at ``temperature`` [M] fp32 with ``seeds`` / ``positions`` [M] int64."""
    m = idx.numel()
    if x.dtype != torch.float32 or x.stride(-1) != 1:
        raise ValueError("logits must be fp32 with a contiguous last dim")
    out = torch.empty(m, dtype=torch.int64, device=x.device)
    if m == 0:
        return out
    _race_kernel[(m,)](x, idx.long(), temperature.float(), seeds.long(), positions.long(), out,
                       x.shape[-1], x.stride(0), GOLDEN, MIX1, MIX2, BV=2048, num_warps=8)
    return out
