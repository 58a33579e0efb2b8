"""Exact fp32 -> bf16 / fp8 casts for the Triton interpreter (CPU runs of GPU kernels).

The interpreter of Triton 3.7 converts floats bit by bit in ``_convert_float``: fp32 -> bf16
truncates (about half the values come out one ulp low) and fp32 -> e4m3 ORs the rounding carry
into the wrong place (values that round up into the next binade come out halved, 7.88 -> 4.0;
docs/platform.md section 2.1). On the GPU the same ``.to()`` is ``cvt.rn.bf16.f32`` and
``cvt.rn.satfinite.e4m3x2.f32``: round to nearest even, e4m3 saturating at +-448.

``install()`` wraps ``_convert_float`` so those two downcasts round like the hardware (torch's own
round-to-nearest-even conversion, clamped to +-448 for e4m3); every other conversion goes to
the original. It is idempotent and is called by the CPU launch paths of glmlab's Triton kernels,
so interpreter results stay comparable with the torch references. It knows nothing about the
kernels themselves and changes nothing when Triton runs on a GPU.
"""

from __future__ import annotations

import numpy as np
import torch

_INSTALLED = False


def install() -> None:
    """Make the interpreter's fp32 -> bf16 and fp32 -> e4m3 casts round to nearest even."""
    global _INSTALLED
    if _INSTALLED:
        return
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float
    targets = {tl.bfloat16: torch.bfloat16, tl.float8e4nv: torch.float8_e4m3fn}

    def convert(data, input_dtype, output_dtype, rounding_mode):
        target = targets.get(output_dtype)
        rtz = rounding_mode is not None and "RTZ" in str(rounding_mode)
        if input_dtype != tl.float32 or target is None or rtz:
            return original(data, input_dtype, output_dtype, rounding_mode)
        values = torch.from_numpy(np.ascontiguousarray(data).view(np.float32).copy())
        if target == torch.float8_e4m3fn:
            values = values.clamp(-448.0, 448.0)  # satfinite; NaN stays NaN
            bits = values.to(target).view(torch.uint8).numpy()
        else:
            bits = values.to(target).view(torch.int16).numpy().view(np.uint16)
        return bits.reshape(np.shape(data))

    interpreter._convert_float = convert
    _INSTALLED = True
