"""What every case of the DSA benchmark (``glmlab.bench.ops_dsa``) is measured on and against.

The fixed widths of the sparse-MLA index lists (2051 = 2048 top-k + 3 tail, padded with -1 to
2112), the workloads (decode-like requests sharing one index list over a private context, or
prefill rows each with its own list over one context), the torch reference a kernel's output is
compared with, the timer (``triton.testing.do_bench``, median) and the ceilings measured in the
same process (HBM device copy, dense bf16 and fp8 matmul). GPU only; it times no DSA kernel.
"""

from __future__ import annotations

import torch

from glmlab.kernels.dsa.layout import MlaKVLayout
from glmlab.kernels.dsa.ref import sparse_mla_ref

INDEX_WIDTH, PADDED_WIDTH, RANK, SCALE = 2051, 2112, 512, 256**-0.5
TIMING = {"warmup": "25 ms (5 ms --quick)", "repetitions": "100 ms (25 ms --quick), median"}


def time_us(fn, quick: bool) -> float:
    """Median time of ``fn`` in microseconds (``TIMING``); triton is imported only when timing."""
    import triton.testing

    warm, rep = (5, 25) if quick else (25, 100)
    return float(triton.testing.do_bench(fn, warmup=warm, rep=rep, return_mode="median")) * 1e3


# ---------------------------------------------------------------------------------- ceilings
def measure_ceilings(quick: bool = False) -> dict:
    """HBM copy bandwidth (read + write) and dense bf16 / fp8 matmul rates, measured now."""
    n = 1 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(
        n, dtype=torch.uint8, device="cuda")
    src.random_(0, 255)
    copy_us = time_us(lambda: dst.copy_(src), quick)
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    bf16_us = time_us(lambda: a @ b, quick)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    fp8_us = time_us(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), quick)
    flops = 2.0 * m**3
    return {"ceiling_hbm_tbps": 2 * n / copy_us / 1e6, "ceiling_bf16_tflops": flops / bf16_us / 1e6,
            "ceiling_fp8_tflops": flops / fp8_us / 1e6}


# ---------------------------------------------------------------------------------- workload
def make_workload(rows: int, heads: int, context: int, rows_per_request: int, seed: int = 0,
                  prefill_context: int = 0):
    """bf16 queries [M, H, R], fp32 latent [N, R], [M, 2112] int32 slots (-1 past 2051).

    ``prefill_context`` > 0: one context of that many tokens, every row its own random list.
    Otherwise requests of ``rows_per_request`` rows share one list over a private context.
    """
    g = torch.Generator(device="cuda").manual_seed(seed)
    idx = torch.full((rows, PADDED_WIDTH), -1, dtype=torch.int32, device="cuda")
    if prefill_context:
        latent = torch.randn(prefill_context, RANK, device="cuda", generator=g)
        idx[:, :INDEX_WIDTH] = torch.randint(0, prefill_context, (rows, INDEX_WIDTH),
                                             device="cuda", generator=g, dtype=torch.int32)
        unique_rows = min(prefill_context, rows * INDEX_WIDTH)
    else:
        requests = -(-rows // rows_per_request)
        latent = torch.randn(requests * context, RANK, device="cuda", generator=g)
        picks = torch.rand(requests, context - 3, device="cuda", generator=g).argsort(dim=1)
        pos = torch.cat([picks[:, : INDEX_WIDTH - 3],
                         torch.arange(context - 3, context, device="cuda").expand(requests, 3)], 1)
        slots = pos + torch.arange(requests, device="cuda")[:, None] * context
        idx[:, :INDEX_WIDTH] = slots.repeat_interleave(rows_per_request, 0)[:rows].to(torch.int32)
        unique_rows = requests * INDEX_WIDTH
    q = torch.randn(rows, heads, RANK, device="cuda", generator=g, dtype=torch.bfloat16)
    return q, latent, idx, unique_rows


def torch_reference(q, kv, layout: MlaKVLayout, idx) -> torch.Tensor:
    """The torch path of the model's backend: gather, dequantise, ``sparse_mla_ref``, in chunks."""
    out, step = [], max(1, (1 << 25) // (idx.shape[1] * RANK))
    for s in range(0, q.shape[0], step):
        i = idx[s:s + step].long()
        rows = layout.unpack(kv[i.clamp(min=0).flatten()]).view(*i.shape, RANK)
        out.append(sparse_mla_ref(q[s:s + step], rows, i >= 0, SCALE))
    return torch.cat(out)
