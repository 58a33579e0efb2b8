"""Serving metrics from per-request results, as ``sglang.benchmark.serving`` reports them.

Throughput (requests, input, output, total tokens per second; peak output tokens/s over 1 s
windows), concurrency (peak, and mean = sum of latencies / duration), and TTFT, TPOT, ITL and
end-to-end latency as mean, median, std, P90, P95, P99 (ITL also max), in milliseconds.
TPOT = (latency - TTFT) / (output_len - 1) per request with more than one output token. Cached
tokens are the server's ``cached_tokens``; the hit rate is their share of all input tokens.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from glmlab.bench.client import RequestResult


def _stats(name: str, values: list[float], with_max: bool = False) -> dict[str, float]:
    if not values:
        out = {f"{k}_{name}_ms": 0.0 for k in ("mean", "median", "std", "p90", "p95", "p99")}
        return {**out, f"max_{name}_ms": 0.0} if with_max else out
    a = np.asarray(values) * 1000.0
    out = {f"mean_{name}_ms": float(a.mean()), f"median_{name}_ms": float(np.median(a)),
           f"std_{name}_ms": float(a.std())}
    for p in (90, 95, 99):
        out[f"p{p}_{name}_ms"] = float(np.percentile(a, p))
    if with_max:
        out[f"max_{name}_ms"] = float(a.max())
    return out


def _peak_concurrency(results: list[RequestResult]) -> int:
    events = sorted([(r.start, 1) for r in results] + [(r.start + r.latency, -1)
                                                          for r in results])
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def summarize(results: list[RequestResult], duration_s: float) -> dict[str, float]:
    ok = [r for r in results if r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    windows = Counter(int(t) for r in ok for t in r.chunk_times)
    dur = max(duration_s, 1e-9)
    out = {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration_s,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur, "input_throughput": total_in / dur,
        "output_throughput": total_out / dur, "total_throughput": (total_in + total_out) / dur,
        "max_output_tokens_per_s": float(max(windows.values(), default=0)),
        "max_concurrency_observed": _peak_concurrency(ok),
        "mean_concurrency": sum(r.latency for r in ok) / dur,
        "cached_tokens": cached, "cache_hit_rate": cached / total_in if total_in else 0.0,
    }
    tpot = [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    out.update(_stats("ttft", [r.ttft for r in ok]))
    out.update(_stats("tpot", tpot))
    out.update(_stats("itl", [x for r in ok for x in r.itl], with_max=True))
    out.update(_stats("e2e_latency", [r.latency for r in ok]))
    return {k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v)
            for k, v in out.items()}


def meets_slo(summary: dict, ttft_ms: float, tpot_ms: float) -> bool:
    """No failures, mean TTFT within ``ttft_ms`` and mean TPOT within ``tpot_ms`` (0 = no limit)."""
    if summary["failed"] or not summary["completed"]:
        return False
    return ((not ttft_ms or summary["mean_ttft_ms"] <= ttft_ms)
            and (not tpot_ms or summary["mean_tpot_ms"] <= tpot_ms))


def format_table(summary: dict) -> str:
    keys = ("completed", "failed", "duration_s", "request_throughput", "input_throughput",
            "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
            "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p95_itl_ms", "mean_e2e_latency_ms",
            "p99_e2e_latency_ms", "cached_tokens", "cache_hit_rate", "max_concurrency_observed")
    return "\n".join(f"{k:<28}{summary[k]}" for k in keys if k in summary)
