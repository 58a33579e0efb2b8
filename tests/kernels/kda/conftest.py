"""Let fla's Triton KDA kernels run under the Triton interpreter on CPU (docs/platform.md section 2.3).

Three shims, applied only when there is no GPU: autotuning measures nothing (one config is taken),
plain-int loop indices gain the ``.to()`` fla calls on them, and fla's TileLang dispatch is off.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch


@pytest.fixture(scope="session")
def fla_on_cpu():
    if torch.cuda.is_available():
        return
    os.environ.setdefault("FLA_TILELANG", "0")
    from triton.runtime import autotuner

    autotuner.Autotuner.do_bench = property(
        lambda self: lambda fn, quantiles=None, **kw: [0.0] * 3 if quantiles else 0.0
    )

    class _IntTo(int):
        def to(self, *a, **k):
            return int(self)

    import fla.ops.common.chunk_delta_h  # noqa: F401
    import fla.ops.kda.chunk_fwd  # noqa: F401
    import fla.ops.kda.fused_recurrent  # noqa: F401

    for name, mod in list(sys.modules.items()):
        if name.startswith("fla.") and mod is not None:
            mod.__dict__["range"] = lambda *a: (_IntTo(i) for i in range(*a))


def kda_case(b, t, h, k, v, seed=0, strong_decay=False):
    """Random normalised KDA inputs q, k [B, T, H, K], v [B, T, H, V], g, beta, initial state."""
    from glmlab.kernels.kda.ref import l2norm

    g = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(b, t, h, k, generator=g)) * k**-0.5
    kk = l2norm(torch.randn(b, t, h, k, generator=g))
    vv = torch.randn(b, t, h, v, generator=g)
    decay = -torch.rand(b, t, h, k, generator=g) * (5.0 if strong_decay else 0.3)
    beta = torch.rand(b, t, h, generator=g)
    s0 = torch.randn(b, h, k, v, generator=g) * 0.5
    return q, kk, vv, decay, beta, s0


@pytest.fixture
def make_kda_case():
    return kda_case
