"""Real-width check of the fused decode path (GPU): a ``slice:4`` model with random block-FP8
weights drawn on the GPU, a decode step over a cache at 3,000 tokens (so the indexer selects),
fused backends against the reference path that applies the same W8A8 recipe, on identical cache
contents; the fused step has no host sync, and its CUDA-graph replay matches it.

The two paths differ where fp32 summation order moves an activation across an E4M3 rounding
boundary (~1e-3 per layer on the tiny model) and by bf16 rounding of the fused kernels' outputs.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from glmlab.bench import ops_decode
from glmlab.engine.cuda_graph import CudaGraphRunner
from glmlab.kernels.fp8.ref import linear_fp8_ref
from glmlab.model.backends import Backends
from glmlab.model.layers import Linear
from glmlab.model.plan import StepPlan
from glmlab.model.session import run_step
from glmlab.testing.syncs import sync_debug

pytestmark = pytest.mark.gpu


def _w8a8_linear(x, linear, residual=None, x_scale=None):
    y = linear_fp8_ref(x.reshape(-1, x.shape[-1]), linear.weight, linear.weight_scale_inv,
                       tuple(linear.block)).view(*x.shape[:-1], -1)
    return y if residual is None else y + residual


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_slice4_fused_step_matches_reference_and_graph():
    model = ops_decode.build_model("slice:4", seed=0)
    cache = ops_decode.build_cache(model, batch=4, context=3000)
    plan = ops_decode.step_plan(cache, 4, 3000, 1, None, model.cfg.vocab_size)
    plan = StepPlan(plan.input_ids, plan.forward, None, (0,))  # also capture layer 0
    snapshot = {k: t[0].clone() for k, t in cache.regions().items()}

    def restore():
        for k, t in cache.regions().items():
            t[0].copy_(snapshot[k])

    model.use_backends(Backends(kda="fla", sparse_mla="tilelang", moe="triton"))
    for m in model.modules():
        if isinstance(m, Linear):
            m.fp8_op = _w8a8_linear
    ref = run_step(model, cache, plan)
    restore()
    # The noise floor of this random model: the same reference with its embeddings moved by half
    # a bf16 ulp (relative 2**-9, seeded). The fused path rounds to bf16 or E4M3 at more places
    # per layer than the reference does (fused norms, GEMM epilogues, fused quantisation), each
    # such a half-ulp move; independent moves add in quadrature, so ~16 per layer reach the
    # logits as ~4x the floor. A wrong kernel moves them by O(1), not by a multiple of the floor.
    gen = torch.Generator(device="cuda").manual_seed(0)
    hook = model.embed_tokens.register_forward_hook(
        lambda _m, _i, out: out * (1 + 2.0**-9 * torch.randn(out.shape, device=out.device,
                                                            generator=gen)).to(out.dtype))
    nudged = run_step(model, cache, plan)
    hook.remove()
    restore()
    floor = _rel(nudged.logits, ref.logits)
    model.use_backends(Backends.fast())
    run_step(model, cache, plan)  # compile
    restore()
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with sync_debug("error"):
            fast = run_step(model, cache, plan)
    torch.cuda.synchronize()
    layer0, logits = _rel(fast.features, ref.features), _rel(fast.logits, ref.logits)
    print(f"fused vs W8A8 reference: layer 0 {layer0:.2e}, logits {logits:.2e}; the "
          f"reference's half-ulp floor at the logits {floor:.2e}")
    assert floor > 0 and layer0 < 2e-2 and logits < 4 * floor
    restore()
    runner = CudaGraphRunner(model, cache, 4, plan.forward.page_table.shape[1], [4])
    runner.capture(1, None, (0,))
    restore()
    graphed = runner.run(plan)
    assert _rel(graphed.logits, fast.logits) < 1e-2
    assert torch.equal(graphed.logits.argmax(-1), fast.logits.argmax(-1))
