"""The ``triton`` ``kda_step``: a KDA layer's uniform step (decode, verify) without host work.

For a step in which every sequence brings the same n new tokens (``ForwardPlan.uniform_width``),
between the layer input and o_proj:

  fused projections (q|k|v, f_a|g_a|b) -> f_b, g_b
  -> ``kernels/kda/prep_triton.kda_prep``: conv with the carried state (in place), SiLU, L2 norm,
     gate, beta, in one launch
  -> ``kernels/decode/kda_window_triton.kda_window``: the delta rule from the state at each
     request's slot, in place, and the gated head norm, in one launch.

A speculative verify records the window's conv inputs and its recurrence inputs with the
``VerifyRecorder`` and leaves the committed KDA state alone (the commit replays the accepted
steps). Recorders that cannot take the recurrence inputs alone (SNAPSHOT mode) compute the window
themselves. Any other step (prefill, mixed) runs the layer's ``reference_step``. Shapes are fixed by
the plan's sizes; nothing is read back to the host, so the step can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from glmlab.kernels.decode.kda_window_triton import kda_window
from glmlab.kernels.kda.prep_triton import kda_prep


def kda_step(layer, h: torch.Tensor, plan, cache) -> torch.Tensor:
    n = plan.uniform_width
    if not n or layer.fast_conv_weight is None or layer.cfg.conv_kernel != 4:
        return layer.reference_step(h, plan, cache)
    k, idx, slots, verify = layer.cfg, layer.layer_idx, plan.state_slots, plan.verify
    qkv, fa, ga, b = layer.projections(h)
    f = layer.f_b_proj(fa)
    gate = layer.g_b_proj(ga)
    conv = cache.conv[idx]
    if verify is not None:
        verify.record_conv(idx, slots, conv[slots], qkv)
    q, kk, v, g, beta = kda_prep(qkv, conv, slots, layer.fast_conv_weight, f, layer.A_log,
                                 layer.dt_bias, k.lower_bound, b, k.num_heads)
    state = cache.recurrent[idx]
    if verify is None:
        return kda_window(q, kk, v, g, beta, state, slots, gate, layer.o_norm, layer.eps, True)
    record = getattr(verify, "record_kda_steps", None)
    if record is not None and record(idx, slots, kk, v, g, beta):
        return kda_window(q, kk, v, g, beta, state, slots, gate, layer.o_norm, layer.eps, False)
    out, _ = verify.kda_recurrence(idx, slots, q, kk, v, g, beta, state[slots].float())
    gate = gate.unflatten(-1, (k.num_heads, k.head_dim))
    return layer._gated_norm(out.to(h.dtype), gate).flatten(1)
