"""Prometheus metrics of one worker under SGLang's names: request counters and latency
histograms pushed as requests finish, pool gauges read on scrape.

Names are SGLang's (``sglang:prompt_tokens_total``, ``sglang:time_to_first_token_seconds``...),
so dashboards written for SGLang read a glmlab worker unchanged. Gauges (queue, running, pool
occupancy, cache hit rate, speculative accept length) are read from the backend's ``stats()`` at
scrape time rather than pushed, so they can never drift from the engine's own accounting.
Counters follow the answer's ``usage``: a prompt with ``n`` samples counts its prompt tokens (and
its prefix-cache hits, ``sglang:cached_tokens_total``) once, its output tokens for every sample;
``sglang:num_requests_total`` counts every sample. What the engine actually ran is read from its
own counts at scrape time: ``sglang:realtime_tokens_total`` by ``mode`` (``prefill_compute``: prompt
positions computed, a prompt of n samples once; ``prefill_cache``; ``decode``) and glmlab's
``sglang:kv_pages_allocated_total``. This module knows
one worker; ``observe.py`` adds the workers of a service together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# stats() keys that are counters of their own, already exported under the pushed counters' names
_NOT_GAUGES = frozenset({"cached_tokens_total"})
# stats() keys that are the engine's own running counts -> (counter family, its labels)
_COUNTERS = {
    "prefill_compute_tokens": ("sglang:realtime_tokens", {"mode": "prefill_compute"}),
    "prefill_cache_tokens": ("sglang:realtime_tokens", {"mode": "prefill_cache"}),
    "decode_tokens": ("sglang:realtime_tokens", {"mode": "decode"}),
    "pages_allocated": ("sglang:kv_pages_allocated", {}),
}
_COUNTER_DOCS = {
    "sglang:realtime_tokens": "tokens the engine ran, by mode: prompt positions computed in "
                              "prefill chunks, prompt tokens served from the prefix cache, "
                              "tokens sampled by decode steps",
    "sglang:kv_pages_allocated": "KV pages handed out by the pool (shared pages once)",
}


class _StatsCollector:
    def __init__(self, stats: Callable[[], dict[str, float]]):
        self._stats = stats

    def collect(self):
        counters: dict[str, CounterMetricFamily] = {}
        for name, value in self._stats().items():
            if name in _COUNTERS:
                family, labels = _COUNTERS[name]
                if family not in counters:
                    counters[family] = CounterMetricFamily(family, _COUNTER_DOCS[family],
                                                           labels=sorted(labels))
                counters[family].add_metric([labels[k] for k in sorted(labels)], float(value))
            elif name not in _NOT_GAUGES:
                yield GaugeMetricFamily(f"sglang:{name}", name.replace("_", " "),
                                        value=float(value))
        yield from counters.values()


class ServeMetrics:
    def __init__(self, stats: Callable[[], dict[str, float]]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("sglang:num_requests", "finished requests", ["status"],
                                registry=r)
        self.prompt_tokens = Counter("sglang:prompt_tokens", "prompt tokens of finished "
                                     "requests", registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "output tokens of finished "
                                         "requests", registry=r)
        self.cached_tokens = Counter("sglang:cached_tokens", "prompt tokens served from the "
                                     "prefix cache", registry=r)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("sglang:time_per_output_token_seconds", "mean time per output "
                              "token after the first, one observation per request",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "time between two output "
                             "tokens, one observation per token after the first",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        r.register(_StatsCollector(stats))

    def finished(self, status: str, prompt: int, output: int, cached: int, ttft: float | None,
                 e2e: float, gaps: Sequence[tuple[float, int]] = ()) -> None:
        """``gaps``: (seconds since the previous record with tokens, tokens in this one) for
        every record after the first; a record of k tokens counts as k gaps of 1/k each."""
        self.requests.labels(status).inc()
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(output)
        self.cached_tokens.inc(cached)
        self.e2e.observe(e2e)
        if ttft is not None:
            self.ttft.observe(ttft)
            if output > 1:
                self.tpot.observe((e2e - ttft) / (output - 1))
        for seconds, tokens in gaps:
            for _ in range(tokens):
                self.itl.observe(seconds / tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
