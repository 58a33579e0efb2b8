"""Prometheus metrics of one worker: request counters and latency histograms, pool gauges on scrape.

Gauges (queue, running, pool occupancy, cache hit rate) are read from the backend's ``stats()`` at
scrape time rather than pushed, so they can never drift from the engine's own accounting.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _StatsCollector:
    def __init__(self, stats: Callable[[], dict[str, float]]):
        self._stats = stats

    def collect(self):
        for name, value in self._stats().items():
            yield GaugeMetricFamily(f"glmlab:{name}", name.replace("_", " "), value=float(value))


class ServeMetrics:
    def __init__(self, stats: Callable[[], dict[str, float]]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("glmlab:requests", "finished requests", ["status"], registry=r)
        self.prompt_tokens = Counter("glmlab:prompt_tokens", "prompt tokens", registry=r)
        self.generation_tokens = Counter("glmlab:generation_tokens", "output tokens", registry=r)
        self.cached_tokens = Counter("glmlab:cached_tokens", "prompt tokens served from the "
                                     "prefix cache", registry=r)
        self.ttft = Histogram("glmlab:time_to_first_token_seconds", "TTFT",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("glmlab:time_per_output_token_seconds", "TPOT (after the first)",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("glmlab:e2e_request_latency_seconds", "request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        r.register(_StatsCollector(stats))

    def finished(self, status: str, prompt: int, output: int, cached: int, ttft: float | None,
                 e2e: float) -> None:
        self.requests.labels(status).inc()
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(output)
        self.cached_tokens.inc(cached)
        self.e2e.observe(e2e)
        if ttft is not None:
            self.ttft.observe(ttft)
            if output > 1:
                self.tpot.observe((e2e - ttft) / (output - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
