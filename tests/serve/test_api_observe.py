"""/metrics aggregated at the service's port, and the requests the router cannot carry sent to
the workers by the front (serve/direct.py), on the shared 1P1D service: token-id prompts through
the official ``openai`` client, a list of texts on /generate, the sampling parameters the router
drops (logit_bias, seed), streamed and whole."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from glmlab.serve.direct import router_cannot_carry, sub_requests
from tests.serve.conftest import http, sse_events

openai = pytest.importorskip("openai")

IDS = [5, 17, 33, 2, 91, 64, 7, 8, 120, 44, 3]


def scrape(url: str) -> dict:
    """{(sample name, frozenset of labels): value} of the front's /metrics."""
    status, text = http(f"{url}/metrics")
    assert status == 200, text
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(m: dict, name: str, role: str, **labels) -> float:
    want = {("role", role), ("model_name", "tiny"), *labels.items()}
    return sum(v for (n, ls), v in m.items() if n == name and want <= ls)


def settle(url: str) -> None:
    """Until no worker holds a request, a page or a transfer (the prefill answers last)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = http(f"{url}/server_info")[1]["workers"]
        if all(r.get("running") == 0 and r.get("used_pages") == 0
               and r.get("pending_transfers") == 0 for r in rows):
            return
        time.sleep(0.1)
    raise AssertionError(f"workers still busy: {rows}")


def greedy(n: int, **extra) -> dict:
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **extra}


@pytest.fixture(scope="module")
def client(pd):
    return openai.OpenAI(base_url=f"{pd.url}/v1", api_key="none", max_retries=0)


def test_router_cannot_carry_names_exactly_what_the_router_refuses_or_drops():
    assert router_cannot_carry("/v1/completions", {"prompt": [1, 2]})
    assert router_cannot_carry("/v1/completions", {"prompt": [[1, 2], [3]]})
    assert router_cannot_carry("/v1/completions", {"prompt": ["a", "b"]}) is None
    assert router_cannot_carry("/generate", {"text": ["a", "b"]})
    assert "logit_bias" in router_cannot_carry("/generate", {"text": "a", "sampling_params":
                                                             {"logit_bias": {"1": 2}}})
    assert router_cannot_carry("/generate", {"input_ids": [[1], [2]]}) is None
    assert router_cannot_carry("/v1/chat/completions", {"prompt": [1]}) is None
    assert sub_requests("/generate", {"text": ["a", "b"], "sampling_params": {"n": 3}}) == 6
    assert sub_requests("/v1/completions", {"prompt": [1, 2], "n": 2}) == 2


def test_metrics_count_exactly_the_requests_tokens(pd, client):
    settle(pd.url)
    before = scrape(pd.url)
    prompts, outputs, requests = 0, 0, 0
    for ids, n in ((IDS, 4), (IDS[:5] * 5, 3)):
        out = http(f"{pd.url}/generate", {"input_ids": ids, "sampling_params": greedy(n)})[1]
        prompts += out["meta_info"]["prompt_tokens"]
        outputs += len(out["output_ids"])
        requests += 1
    done = client.completions.create(model="tiny", prompt="Hello there", max_tokens=5, n=2,
                                     temperature=1.0, seed=3, extra_body={"ignore_eos": True})
    prompts += done.usage.prompt_tokens  # once for its two samples
    outputs += done.usage.completion_tokens
    requests += 2
    settle(pd.url)
    after = scrape(pd.url)

    def moved(name, role, **labels):
        return value(after, name, role, **labels) - value(before, name, role, **labels)

    for role in ("prefill", "decode"):
        assert moved("sglang:prompt_tokens_total", role) == prompts
        assert moved("sglang:num_requests_total", role) == requests
    assert moved("sglang:generation_tokens_total", "decode") == outputs
    assert moved("sglang:e2e_request_latency_seconds_count", "decode") == requests
    assert moved("sglang:time_to_first_token_seconds_count", "decode") == requests
    assert moved("sglang:time_per_output_token_seconds_count", "decode") == requests
    # every output token after a sample's first is one inter-token gap
    assert moved("sglang:inter_token_latency_seconds_count", "decode") == outputs - requests
    buckets = sorted(((float(dict(ls)["le"]), v) for (n, ls), v in after.items()
                      if n == "sglang:time_to_first_token_seconds_bucket"
                      and ("role", "decode") in ls))
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert buckets[-1][1] == value(after, "sglang:time_to_first_token_seconds_count", "decode")
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "sglang:cache_hit_rate"):
        for role in ("prefill", "decode"):
            assert (name, frozenset({("role", role), ("model_name", "tiny")})) in after
    assert value(after, "sglang:num_running_reqs", "decode") == 0
    assert 0.0 <= value(after, "sglang:cache_hit_rate", "prefill") <= 1.0
    assert value(after, "sglang:scrape_failures", "decode") == 0


def test_token_id_prompts_through_the_openai_client(pd, client):
    ref = http(f"{pd.url}/generate", {"input_ids": IDS, "sampling_params": greedy(6)})[1]
    out = client.completions.create(model="tiny", prompt=IDS, max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.usage.prompt_tokens == len(IDS)
    assert out.choices[0].text == ref["text"]
    two = client.completions.create(model="tiny", prompt=[IDS, IDS[:4]], max_tokens=6,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].text == ref["text"]
    settle(pd.url)


def test_a_list_of_texts_on_generate(pd):
    texts = ["Hello", "the weather in Paris is"]
    singles = [http(f"{pd.url}/generate", {"text": t, "sampling_params": greedy(5)})[1]
               for t in texts]
    status, out = http(f"{pd.url}/generate", {"text": texts, "sampling_params": greedy(5)})
    assert status == 200, out
    assert [o["output_ids"] for o in out] == [s["output_ids"] for s in singles]
    settle(pd.url)


@pytest.mark.parametrize("stream", [False, True])
def test_logit_bias_and_seed_reach_the_workers(pd, stream):
    body = {"input_ids": IDS, "stream": stream,
            "sampling_params": greedy(4, logit_bias={"42": 100})}
    status, out = http(f"{pd.url}/generate", body)
    assert status == 200, out
    final = [e for e in sse_events(out) if e != "[DONE]"][-1] if stream else out
    assert final["output_ids"] == [42] * 4
    seeded = {"input_ids": IDS, "sampling_params": {"max_new_tokens": 8, "temperature": 1.0,
                                                    "ignore_eos": True, "seed": 11}}
    a, b = (http(f"{pd.url}/generate", seeded)[1]["output_ids"] for _ in range(2))
    assert a == b
    settle(pd.url)
