"""One comparison function for every reference-vs-implementation test.

``assert_close(name, ref, out, recipe)`` reports max-abs, relative RMS and cosine difference,
checks that inf/NaN positions match, and names the worst coordinate. Tolerances live in one table
keyed by number format / recipe (``TOLERANCES``), never in individual tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    rel_rms: float  # ||out - ref|| / ||ref||
    max_abs_rel: float  # max |out - ref| / max |ref|


TOLERANCES = {
    "fp32": Tolerance(rel_rms=1e-5, max_abs_rel=1e-5),
    "fp32_chunk": Tolerance(rel_rms=5e-5, max_abs_rel=1e-4),  # reassociated sums (chunked forms)
    "fp32_model": Tolerance(rel_rms=1e-5, max_abs_rel=1e-5),  # whole-model logits, fp32
    "bf16": Tolerance(rel_rms=3 / 128, max_abs_rel=6 / 128),
    "bf16_model": Tolerance(rel_rms=0.06, max_abs_rel=0.25),  # whole-model logits, bf16 roundings
    "fp8_block": Tolerance(rel_rms=0.08, max_abs_rel=0.4),  # weights dequantised vs not quantised
    "fp8_mma": Tolerance(rel_rms=5e-4, max_abs_rel=1e-3),  # SM90 FP8 MMA: ~14-bit partial sums
}


def diff_stats(ref: torch.Tensor, out: torch.Tensor) -> dict:
    r, o = ref.double(), out.double()
    finite = torch.isfinite(r) & torch.isfinite(o)
    d = (o - r).abs().masked_fill(~finite, 0)
    denom = r.masked_fill(~finite, 0).norm().clamp(min=1e-30)
    cos = (
        torch.nn.functional.cosine_similarity(r[finite].flatten(), o[finite].flatten(), dim=0)
        if finite.any()
        else torch.tensor(1.0)
    )
    worst = tuple(int(i) for i in torch.unravel_index(d.argmax(), d.shape)) if d.numel() else ()
    return {
        "max_abs": float(d.max()) if d.numel() else 0.0,
        "max_abs_rel": float(d.max() / r.masked_fill(~finite, 0).abs().max().clamp(min=1e-30))
        if d.numel()
        else 0.0,
        "rel_rms": float((o - r).masked_fill(~finite, 0).norm() / denom),
        "cos_diff": float(1 - cos),
        "worst": worst,
    }


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, recipe: str) -> dict:
    if ref.shape != out.shape:
        raise AssertionError(f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    if not torch.equal(torch.isnan(ref), torch.isnan(out)) or not torch.equal(
        torch.isinf(ref), torch.isinf(out)
    ):
        raise AssertionError(f"{name}: inf/NaN positions differ from the reference")
    tol = TOLERANCES[recipe]
    s = diff_stats(ref, out)
    if s["rel_rms"] > tol.rel_rms or s["max_abs_rel"] > tol.max_abs_rel:
        raise AssertionError(
            f"{name} ({recipe}): rel_rms {s['rel_rms']:.3g} (tol {tol.rel_rms:.3g}), max_abs_rel "
            f"{s['max_abs_rel']:.3g} (tol {tol.max_abs_rel:.3g}), cos_diff {s['cos_diff']:.3g}; "
            f"worst at {s['worst']}: ref {float(ref.double()[s['worst']]):.6g} "
            f"out {float(out.double()[s['worst']]):.6g}"
        )
    return s


def assert_bitwise_equal(name: str, ref: torch.Tensor, out: torch.Tensor) -> None:
    """Exact equality of bytes (for data movement: stores, gathers, packs)."""
    if ref.shape != out.shape or ref.dtype != out.dtype:
        raise AssertionError(
            f"{name}: {out.dtype}{tuple(out.shape)} vs {ref.dtype}{tuple(ref.shape)}"
        )
    a = ref.contiguous().view(torch.uint8).flatten()
    b = out.contiguous().view(torch.uint8).flatten()
    bad = (a != b).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise AssertionError(
            f"{name}: {bad.numel()} bytes differ; first at byte {i}: {int(a[i])} vs {int(b[i])}"
        )
