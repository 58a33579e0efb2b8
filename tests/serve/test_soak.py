"""Soak through HTTP: a few hundred mixed requests at the service's one address, about 30% of
them left by their client at a random point, then every pool of every worker is back to empty.

Mixed: the three generation routes, streamed and whole, prompts sharing a few prefixes (the
radix trees hit), 1-8 output tokens, 16 in flight. Checked afterwards through ``GET /server_info``
at the front (``faultclient.wait_quiet``): nothing running, waiting or parked, no page or state
slot held by a request, the radix tree holding only evictable pages, no transfer pending, each
engine's own leak check "ok". Requests whose client stayed must all have succeeded in full.
"""

from __future__ import annotations

import asyncio
import random
import time

from tests.serve.conftest import http
from tests.serve.faultclient import Ask, run_all, wait_quiet

NUM, CONCURRENCY, LEAVE = 300, 16, 0.3


def asks(seed: int = 21) -> list[Ask]:
    rng = random.Random(seed)
    id_prefixes = [[(g * 37 + j * 11) % 250 for j in range(32)] for g in range(4)]
    systems = [f"You are assistant number {g}. Answer briefly and politely." for g in range(4)]
    out = []
    for i in range(NUM):
        g, n, stream = rng.randrange(4), rng.randint(1, 8), rng.random() < 0.5
        route = rng.choice(("generate", "completions", "chat"))
        if route == "generate":
            ids = id_prefixes[g] + [rng.randrange(250) for _ in range(rng.randint(1, 20))]
            path, body = "/generate", {"input_ids": ids, "stream": stream, "sampling_params": {
                "max_new_tokens": n, "temperature": rng.choice((0, 0.8)), "ignore_eos": True}}
        else:
            common = {"model": "tiny", "max_tokens": n, "ignore_eos": True, "stream": stream,
                      "temperature": rng.choice((0, 0.8))}
            if route == "completions":
                path, body = "/v1/completions", {**common,
                                                 "prompt": f"{systems[g]} Question {i}:"}
            else:
                path, body = "/v1/chat/completions", {**common, "messages": [
                    {"role": "system", "content": systems[g]},
                    {"role": "user", "content": f"question {i}"}]}
        leave = None
        if rng.random() < LEAVE:  # after some events of a stream, or some time of a whole one
            leave = rng.randint(1, 3) if stream else rng.uniform(0.01, 0.4)
        out.append(Ask(path, body, leave))
    return out


def completion_tokens(body: dict) -> int:
    return body["meta_info"]["completion_tokens"] if "meta_info" in body \
        else body["usage"]["completion_tokens"]


def test_soak_mixed_requests_with_clients_leaving_leaves_every_pool_empty(pd):
    plan = asks()
    started = time.monotonic()
    seen = asyncio.run(run_all(pd.url, plan, concurrency=CONCURRENCY, timeout_s=300))
    took = time.monotonic() - started
    left = [s for s in seen if s.left]
    assert len(left) >= NUM * LEAVE / 2, len(left)  # the disconnect paths really ran
    stayed = [(a, s) for a, s in zip(plan, seen, strict=True) if a.leave_after is None]
    bad = [(a.path, s.status, s.error, s.transport) for a, s in stayed
           if s.failed or not s.done or s.status != 200]
    assert not bad, bad[:5]
    whole = [(a, s) for a, s in stayed if not a.body["stream"]]
    for a, s in whole:  # ignore_eos: exactly what was asked
        asked = a.body.get("max_tokens") or a.body["sampling_params"]["max_new_tokens"]
        assert completion_tokens(s.body) == asked, (a, s.body)
    assert not [s for s in left if s.failed], [s.error for s in left if s.failed][:5]
    rows = wait_quiet(pd.url, 20.0)
    prefill = next(r for r in rows if r["role"] == "prefill")
    hits = http(prefill["url"] + "/server_info")[1]["internal_states"][0]["cache_hit_rate"]
    assert hits > 0  # the shared prefixes were served from the radix tree
    print(f"\nsoak: {NUM} requests ({len(left)} left mid-way) in {took:.1f} s, "
          f"concurrency {CONCURRENCY}; prefill cache hit rate {hits:.2f}")
