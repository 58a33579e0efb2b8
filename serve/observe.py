"""``GET /metrics`` at the service's port: every worker's own ``/metrics`` (SGLang's names,
metrics.py) scraped and added together, one series per role.

Counters and count gauges (running, queued, pages...) are summed over the workers of a role;
histograms are merged bucket by bucket (every worker uses the same buckets, metrics.py); the
three ratio gauges are recomputed from the sums rather than added: ``sglang:token_usage`` =
pages used / pages, ``sglang:cache_hit_rate`` weighted by each worker's prompt tokens,
``sglang:spec_accept_length`` weighted by its verification cycles. Every series gets the labels
``role`` (prefill / decode / mixed) and ``model_name``, as SGLang's carry the model's name. In PD
a request is counted by both its prefill and its decode worker, as SGLang's servers each count
it: prompt tokens and TTFT of the prefill work read ``role="prefill"``, output tokens and the
client's latencies ``role="decode"``; adding the roles together double counts. A worker that
does not answer is left out and named in a comment line and in ``sglang:scrape_failures``.
Knows HTTP and the text format; not the engine.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

# ratio gauge -> (numerator gauge, denominator gauge), or (None, weight) for a weighted mean
_RATIOS = {"sglang:token_usage": ("sglang:pages_used", "sglang:pages_total"),
           "sglang:cache_hit_rate": (None, "sglang:prompt_tokens"),
           "sglang:spec_accept_length": (None, "sglang:spec_cycles")}


class _Fixed:
    """A collector of already built families (for ``generate_latest``)."""

    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self):
        return self.families


def _weight(families: dict, name: str) -> float:
    fam = families.get(name)
    return sum(s.value for s in fam.samples if not s.name.endswith("_created")) if fam else 0.0


def aggregate(scraped: list[tuple[str, str]], model_name: str,
              extra: tuple[Metric, ...] = ()) -> bytes:
    """``scraped``: (role, the worker's /metrics text) -> one Prometheus text (with ``extra``
    families of the front's own)."""
    per_worker = []  # (role, {family name: family})
    for role, text in scraped:
        # the *_created start times parse as families of their own: adding them means nothing
        per_worker.append((role, {f.name: f for f in text_string_to_metric_families(text)
                                  if not f.name.endswith("_created")}))
    meta: dict[str, tuple[str, str]] = {}
    sums: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
    ratio_parts: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for role, families in per_worker:
        for name, fam in families.items():
            meta.setdefault(name, (fam.documentation, fam.type))
            if name in _RATIOS:
                num, den = _RATIOS[name]
                value = fam.samples[0].value
                if num is None:  # weighted mean
                    w = _weight(families, den)
                    ratio_parts[name, role][0] += value * w
                    ratio_parts[name, role][1] += w
                else:
                    ratio_parts[name, role][0] += _weight(families, num)
                    ratio_parts[name, role][1] += _weight(families, den)
                continue
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                labels = tuple(sorted({**s.labels, "role": role,
                                       "model_name": model_name}.items()))
                sums[name][s.name, labels] += s.value
    out = []
    for name, (doc, kind) in sorted(meta.items()):
        fam = Metric(name, doc, kind)
        if name in _RATIOS:
            for (rname, role), (num, den) in sorted(ratio_parts.items()):
                if rname == name:
                    fam.add_sample(name, {"role": role, "model_name": model_name},
                                   num / den if den else 0.0)
        else:
            for (sample, labels), value in sums[name].items():
                fam.add_sample(sample, dict(labels), value)
        out.append(fam)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(out + list(extra)))
    return generate_latest(registry)


async def scrape(session: aiohttp.ClientSession, url: str, timeout_s: float = 5.0) -> str:
    async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
        if r.status != 200:
            raise aiohttp.ClientResponseError(r.request_info, (), status=r.status,
                                              message=f"HTTP {r.status}")
        return await r.text()


async def aggregate_metrics(session: aiohttp.ClientSession, workers, model_name: str) -> bytes:
    """``workers``: objects with ``name``, ``role``, ``url`` (the supervisor's children)."""
    texts = await asyncio.gather(*(scrape(session, w.url) for w in workers),
                                 return_exceptions=True)
    scraped, failed = [], defaultdict(list)
    for w, text in zip(workers, texts, strict=True):
        if isinstance(text, BaseException):
            failed[w.role].append(f"{w.name}: {type(text).__name__}: {text}")
        else:
            scraped.append((w.role, text))
    fam = Metric("sglang:scrape_failures", "workers whose /metrics did not answer this scrape",
                 "gauge")
    for role in sorted({w.role for w in workers}):
        fam.add_sample(fam.name, {"role": role, "model_name": model_name}, len(failed[role]))
    body = aggregate(scraped, model_name, (fam,))
    notes = "".join(f"# not scraped: {why}\n" for role in sorted(failed) for why in failed[role])
    return body + notes.encode()


def metrics_route(front) -> web.RequestHandler:
    async def metrics(_request: web.Request) -> web.Response:
        body = await aggregate_metrics(front.session, front.service.workers(),
                                       front.service.served_model_name)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})
    return metrics


# mounted by the front (front.EXTRA_ROUTES)
ROUTES = [("GET", "/metrics", metrics_route),
          ("GET", "/get_server_info", lambda front: front.server_info)]
