"""KDA backends on fla's Triton kernels: ``chunk_kda`` (prefill), ``fused_recurrent_kda`` (decode).

Adapters from glmlab's varlen layout ([T, H, *] tokens + cu_seqlens, states [N, H, K, V] fp32) to
fla's [1, T, H, *] layout. The model has already L2-normalised q and k and scaled q, so the kernels
run with ``scale=1`` and no in-kernel norm or gate. q and k are cast to v's dtype (bf16 in a bf16
model), which is what fla's fast path expects; states stay fp32.

Registered as the ``fla`` backend of ``kda_prefill`` / ``kda_decode``; tested against
``kernels/kda/ref.py`` (tests/kernels/kda/test_fla_backend.py).
"""

from __future__ import annotations


def kda_prefill_fla(q, k, v, g, beta, states, cu_seqlens):
    from fla.ops.kda import chunk_kda

    dt = v.dtype
    o, final = chunk_kda(
        q[None].to(dt),
        k[None].to(dt),
        v[None],
        g[None].float(),
        beta[None].to(dt),
        scale=1.0,
        initial_state=states.float(),
        output_final_state=True,
        cu_seqlens=cu_seqlens.long(),
    )
    return o[0], final


def kda_decode_fla(q, k, v, g, beta, states):
    from fla.ops.kda import fused_recurrent_kda

    dt = v.dtype
    o, final = fused_recurrent_kda(
        q[:, None].to(dt),
        k[:, None].to(dt),
        v[:, None],
        g[:, None].float(),
        beta[:, None].to(dt),
        scale=1.0,
        initial_state=states.float(),
        output_final_state=True,
    )
    return o[:, 0], final


__all__ = ["kda_decode_fla", "kda_prefill_fla"]
