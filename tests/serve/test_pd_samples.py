"""``n > 1`` and first-token logprobs through the shared 1P1D service (sglang-router, NIXL over UCX
TCP, tiny model on the CPU), against the mixed service: one prefill of the prompt for its n
samples (read off /metrics), its KV pages allocated once on each side and moved once, every
sample's first token with its top alternatives, the same tokens as the mixed engine's fork."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from glmlab.serve.kvplan import AUX_WIDTH
from glmlab.testing.parity import prompt_ids
from tests.serve.conftest import PAGE, http, transfer_bytes
from tests.serve.test_api_observe import scrape, settle, value

N = 8


def pages(tokens: int) -> int:
    return -(-tokens // PAGE)


def realtime(m: dict, mode: str, role: str) -> float:
    return value(m, "sglang:realtime_tokens_total", role, mode=mode)


def decode_state(pd) -> dict:
    return http(f"{pd.worker('decode0').url}/server_info")[1]["internal_states"][0]


def worker_metrics(url: str) -> dict[str, float]:
    """A worker's own /metrics (no role labels): prefill tokens computed, pages allocated."""
    status, text = http(f"{url}/metrics")
    assert status == 200, text
    out = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == "sglang:realtime_tokens_total" and s.labels["mode"] == "prefill_compute":
                out["prefill_compute"] = s.value
            elif s.name == "sglang:kv_pages_allocated_total":
                out["pages"] = s.value
    return out


def sampled(url: str, ids: list[int], n: int, max_new: int, **extra) -> list[dict]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "n": n,
                                                  "temperature": 1.0, "seed": 7,
                                                  "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 3, **extra}
    status, out = http(f"{url}/generate", body)
    assert status == 200, out
    return out


def test_n_samples_are_one_prefill_and_one_transfer(pd, mixed):
    # ~4K tokens, as the issue asks (the tiny model's context is 4096); fresh tokens: no prefix
    # cache on either side
    prompt = prompt_ids(4000, 31)
    new = 4
    settle(pd.url)
    before, dec0 = scrape(pd.url), decode_state(pd)
    out = sampled(pd.url, prompt, N, new)
    settle(pd.url)
    after, dec1 = scrape(pd.url), decode_state(pd)

    def moved(name, role, **labels):
        return value(after, name, role, **labels) - value(before, name, role, **labels)

    # one prefill of the prompt for the eight samples, and nothing computed twice on decode
    assert realtime(after, "prefill_compute", "prefill") - \
        realtime(before, "prefill_compute", "prefill") == len(prompt)
    assert realtime(after, "prefill_compute", "decode") == \
        realtime(before, "prefill_compute", "decode")
    assert moved("sglang:prompt_tokens_total", "prefill") == len(prompt)  # usage: once
    assert moved("sglang:num_requests_total", "decode") == N
    # the prompt's pages are allocated once on each side; on decode, sample 0 grows its own to
    # the end and the forks take only the pages past the shared whole ones (the partial page
    # copied, room for their own tokens). 4000 tokens end on a page: every sample's first
    # output token starts a page of its own
    whole = len(prompt) // PAGE
    assert moved("sglang:kv_pages_allocated_total", "prefill") == pages(len(prompt))
    assert moved("sglang:kv_pages_allocated_total", "decode") == \
        pages(len(prompt) + new) + (N - 1) * (pages(len(prompt) + new) - whole)
    # and moved once: the prompt's pages and state, one aux row per sample
    page_bytes, fixed = transfer_bytes()
    want = pages(len(prompt)) * page_bytes + fixed + (N - 1) * AUX_WIDTH * 8
    assert dec1["transfer_bytes_received"] - dec0["transfer_bytes_received"] == want
    assert {o["meta_info"]["pd_transfer"]["bytes"] for o in out} == {want}
    assert {o["meta_info"]["pd_transfer"]["samples"] for o in out} == {N}
    # the same samples as the mixed engine's fork, first token included; there too the prompt
    # is computed once and its whole pages allocated once
    url = mixed.children[0].url
    m0 = worker_metrics(url)
    ref = sampled(url, prompt, N, new)
    m1 = worker_metrics(url)
    assert m1["prefill_compute"] - m0["prefill_compute"] == len(prompt)
    assert m1["pages"] - m0["pages"] == pages(len(prompt) + new) + \
        (N - 1) * (pages(len(prompt) + new) - whole)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]
    assert len({tuple(o["output_ids"]) for o in out}) > 1  # eight seeds, not one sample
    for o in out:
        tops = o["meta_info"]["output_top_logprobs"]
        assert len(tops) == new and all(len(t) == 3 for t in tops)  # the first token's too
    for row in http(f"{pd.url}/server_info")[1]["workers"]:
        assert row["leak_check"] == "ok", row


def test_first_token_top_logprobs_equal_mixed_under_greedy(pd, mixed):
    prompt = prompt_ids(45, 32)
    body = {"input_ids": prompt, "return_logprob": True, "top_logprobs_num": 5,
            "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}}
    a = http(f"{pd.url}/generate", body)[1]["meta_info"]
    b = http(f"{mixed.children[0].url}/generate", body)[1]["meta_info"]
    assert [t for _, t, _ in a["output_token_logprobs"]] == \
        [t for _, t, _ in b["output_token_logprobs"]]
    for x, y in zip(a["output_top_logprobs"], b["output_top_logprobs"], strict=True):
        assert [t for _, t, _ in x] == [t for _, t, _ in y] and len(x) == 5
        assert [v for v, _, _ in x] == pytest.approx([v for v, _, _ in y], abs=1e-4)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "temperature": 0, "logprobs": True, "top_logprobs": 4, "n": 2}
    pc = http(f"{pd.url}/v1/chat/completions", chat)[1]
    mc = http(f"{mixed.children[0].url}/v1/chat/completions", chat)[1]
    for c, d in zip(pc["choices"], mc["choices"], strict=True):
        first, want = c["logprobs"]["content"][0], d["logprobs"]["content"][0]
        assert [t["token"] for t in first["top_logprobs"]] == \
            [t["token"] for t in want["top_logprobs"]] and len(first["top_logprobs"]) == 4
    settle(pd.url)


def test_n_samples_left_mid_stream_free_everything(pd):
    """A streamed n=4 request closed after its first chunks (and one closed before the cache
    moved): every page, state slot and staging row comes back on both sides."""

    async def leave(after_chunks: int):
        body = {"input_ids": prompt_ids(120, 33 + after_chunks), "stream": True,
                "sampling_params": {"max_new_tokens": 64, "n": 4, "temperature": 0.7,
                                    "ignore_eos": True}}
        async with aiohttp.ClientSession() as s, s.post(f"{pd.url}/generate", json=body) as r:
            assert r.status == 200
            seen = 0
            async for line in r.content:
                if line.startswith(b"data: {"):
                    json.loads(line[6:])
                    seen += 1
                if seen >= after_chunks:
                    break

    async def both():
        await asyncio.gather(leave(0), leave(3))

    asyncio.run(both())
    settle(pd.url)
    for row in http(f"{pd.url}/server_info")[1]["workers"]:
        assert row["leak_check"] == "ok", row
    out = sampled(pd.url, prompt_ids(30, 40), 3, 2)  # and it keeps serving
    assert len(out) == 3
