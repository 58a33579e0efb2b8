"""Randomised soak: hundreds of requests of random lengths and sampling, arriving over time,
aborted at random in the queue, in prefill and in decode, under memory pressure (preemption,
eviction) with the kv_and_state prefix cache on. Afterwards every page is free or an evictable
tree page, every state slot free or a checkpoint, and the free lists agree with the refcounts."""

from __future__ import annotations

import random

import pytest

from glmlab.core import SamplingParams, Status
from glmlab.model.session import Session
from glmlab.testing.parity import prompt_ids


@pytest.mark.parametrize("radix,num_requests", [("kv_and_state", 300), ("kv_only", 120)])
def test_soak_leaves_every_pool_empty(radix, num_requests, make_engine, tiny_model):
    rng = random.Random(1234)
    prefixes = [prompt_ids(rng.choice((64, 128, 150)), 900 + k) for k in range(4)]
    engine = make_engine(radix=radix, max_pages=40, max_running_requests=24, chunk_size=64,
                         max_prefill_tokens=160, max_num_batched_tokens=192,
                         context_len=320)
    todo, aborted, greedy = num_requests, {}, {}
    live: list[str] = []
    steps = 0
    while todo or engine.has_work:
        for _ in range(min(todo, rng.randint(0, 4))):
            todo -= 1
            base = rng.choice(prefixes) if rng.random() < 0.6 else []
            prompt = (base + prompt_ids(rng.randint(1, 90), rng.randint(0, 10**6)))[:250]
            sampled = rng.random() < 0.3
            params = SamplingParams(temperature=0.9 if sampled else 0.0, top_k=20,
                                    max_new_tokens=rng.randint(1, 40), ignore_eos=True,
                                    seed=rng.randint(0, 99) if sampled else None)
            rid = engine.add_request(prompt, params)
            live.append(rid)
            if not sampled:
                greedy[rid] = (prompt, params)
        if live and rng.random() < 0.15:  # abort someone, wherever it is
            rid = rng.choice(live)
            req = engine.request(rid)
            if req.status is not Status.FINISHED:
                aborted[rid] = ("queued" if req.status is Status.WAITING else
                                "decode" if req.output_ids else "prefill")
                engine.abort(rid)
        engine.step()
        steps += 1
        if steps % 25 == 0:
            engine.cache.pages.check()
            engine.cache.slots.check()
            if engine.cache.tree is not None:
                engine.cache.tree.check()
    engine.cache.check_idle()
    reqs = [engine.request(r) for r in live]
    assert all(r.status is Status.FINISHED for r in reqs)
    assert len(live) == num_requests and set(aborted.values()) == {"queued", "prefill", "decode"}
    if radix == "kv_and_state":
        assert engine.cache.stats.cached_tokens > 0
    assert sum(r.num_preemptions for r in reqs) > 0
    done = [r for r in greedy if r not in aborted][:12]
    for rid in done:  # a sample of the survivors produced exactly the reference tokens
        prompt, params = greedy[rid]
        ref = Session(tiny_model, max_len=len(prompt) + params.max_new_tokens).generate(
            0, prompt, params)
        assert engine.request(rid).output_ids == ref[: len(engine.request(rid).output_ids)]
        assert len(engine.request(rid).output_ids) == min(params.max_new_tokens, 320 - len(prompt))
