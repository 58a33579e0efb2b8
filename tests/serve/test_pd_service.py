"""1P1D behind sglang-router (NIXL over UCX TCP) against the mixed role and `glmlab generate`."""

from __future__ import annotations

import asyncio
import json

from glmlab.bench.client import run_load
from glmlab.bench.workloads import BenchRequest
from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.cli import main as glmlab_main
from tests.serve.conftest import PAGE, cli_generate, generate, http, sse_events, transfer_bytes

PROMPT = [(i * 37 + 11) % 250 for i in range(70)]  # 70 tokens: 5 pages of 16


def test_pd_greedy_tokens_match_mixed_and_glmlab_generate(pd, mixed):
    via_router = generate(pd.url, PROMPT, 12, return_logprob=True)
    direct = generate(mixed.children[0].url, PROMPT, 12, return_logprob=True)
    assert via_router["output_ids"] == direct["output_ids"] == cli_generate(PROMPT, 12)
    assert via_router["meta_info"]["completion_tokens"] == 12
    assert via_router["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    # the first token's logprob travels in the aux row; the rest come from decode
    pd_lp = via_router["meta_info"]["output_token_logprobs"]
    mixed_lp = direct["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in pd_lp] == via_router["output_ids"]
    assert all(abs(a[0] - b[0]) < 1e-4 for a, b in zip(pd_lp, mixed_lp, strict=True))


def test_shared_prefix_transfers_only_missing_pages(pd):
    page_bytes, fixed = transfer_bytes()
    decode_url = pd.worker("decode0").url
    prefill_url = pd.worker("prefill0").url
    sent0 = http(f"{prefill_url}/server_info")[1]["internal_states"][0]["transfer_bytes_sent"]
    prefix = [(i * 13 + 5) % 250 for i in range(4 * PAGE)]  # 4 whole pages
    first = generate(pd.url, prefix + [7] * 20, 4)["meta_info"]["pd_transfer"]
    second = generate(pd.url, prefix + [9] * 30, 4)["meta_info"]["pd_transfer"]
    assert first["decode_prefix_len"] == 0 and first["pages"] == 6  # ceil(84 / 16)
    assert first["bytes"] == 6 * page_bytes + fixed
    assert second["decode_prefix_len"] == 4 * PAGE and second["pages"] == 2  # ceil(94/16) - 4
    assert second["bytes"] == 2 * page_bytes + fixed
    sent1 = http(f"{prefill_url}/server_info")[1]["internal_states"][0]["transfer_bytes_sent"]
    assert sent1 - sent0 == first["bytes"] + second["bytes"]  # what NIXL carried, prefill side
    info = http(f"{decode_url}/server_info")[1]
    assert info["internal_states"][0]["cache_hit_rate"] > 0


def test_streaming_through_the_router(pd):
    full = generate(pd.url, PROMPT, 6)["output_ids"]
    status, text = http(f"{pd.url}/generate", {
        "input_ids": PROMPT, "stream": True,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}})
    assert status == 200
    events = sse_events(text)
    assert events[-1] == "[DONE]" and len(events) >= 7  # one chunk per token, then [DONE]
    ids = [e["output_ids"] for e in events[:-1]]
    assert [len(x) for x in ids] == list(range(1, 7)) and ids[-1] == full
    assert events[-2]["meta_info"]["finish_reason"]["type"] == "length"
    status, text = http(f"{pd.url}/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True})
    events = sse_events(text)
    assert status == 200 and events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-2]["usage"]["completion_tokens"] == 5


def test_openai_and_info_routes_through_the_router(pd):
    status, out = http(f"{pd.url}/v1/completions", {"model": "tiny", "prompt": "Hello, GLM",
                                                    "max_tokens": 4, "ignore_eos": True,
                                                    "temperature": 0})
    assert status == 200 and out["usage"]["completion_tokens"] == 4
    assert out["choices"][0]["finish_reason"] == "length"
    status, out = http(f"{pd.url}/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "ignore_eos": True})
    assert status == 200 and out["choices"][0]["message"]["role"] == "assistant"
    assert http(f"{pd.url}/v1/models")[1]["data"][0]["id"] == "tiny"
    decode = pd.worker("decode0").url
    for path in ("/model_info", "/get_model_info", "/server_info", "/get_server_info"):
        status, out = http(decode + path)
        assert status == 200 and out["model_path"] == str(preset_checkpoint("tiny"))
    status, text = http(decode + "/metrics")
    assert status == 200 and "sglang:time_to_first_token_seconds_bucket" in text
    assert "sglang:num_running_reqs" in text and "sglang:token_usage" in text


def transfer_failures(pd) -> int:
    return http(pd.worker("decode0").url + "/server_info")[1]["internal_states"][0][
        "transfer_failures"]


def test_64_concurrent_requests_then_every_pool_is_empty(pd):
    failures = transfer_failures(pd)  # the session's service also served other tests' faults
    reqs = [BenchRequest(None, tuple((i * 7 + j) % 250 for j in range(20 + i % 30)),
                         20 + i % 30, 4 + i % 5) for i in range(64)]
    results, _ = asyncio.run(run_load(pd.url, "sglang", reqs, "tiny", timeout_s=120))
    bad = [r.error for r in results if not r.success]
    assert not bad, bad[:3]
    assert [r.output_len for r in results] == [q.output_len for q in reqs]
    for name in ("prefill0", "decode0"):
        info = http(pd.worker(name).url + "/server_info")[1]
        state = info["internal_states"][0]
        assert info["leak_check"] == "ok", (name, info["leak_check"])
        assert state["num_running_reqs"] == state["num_queue_reqs"] == 0
        assert state["num_parked_reqs"] == 0  # nothing awaiting import or held for export
        assert state["state_slots_used"] == state["state_checkpoints"]  # only radix checkpoints
    assert transfer_failures(pd) == failures


def test_glmlab_bench_slo_mode_writes_jsonl(pd, tmp_path):
    out = tmp_path / "serve.jsonl"
    port = pd.cfg.port
    code = glmlab_main(["bench", "--port", str(port), "--dataset-name", "random",
                        "--num-prompts", "4", "--random-input-len", "24",
                        "--random-output-len", "4", "--tokenize-prompt", "--warmup-requests",
                        "1", "--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000",
                        "--slo-max-concurrency", "4", "--output-file", str(out)])
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    trials = [r for r in rows if r["slo_trial"]]
    assert [r["max_concurrency"] for r in trials] == [1, 2, 4]  # loose targets: all meet them
    assert all(r["meets_slo"] and r["completed"] == 4 for r in trials)
    final = rows[-1]
    assert final["slo_best_concurrency"] == 4 and final["config"]["backend"] == "sglang"
    for key in ("output_throughput", "p99_ttft_ms", "median_tpot_ms", "p95_itl_ms",
                "mean_e2e_latency_ms", "cached_tokens", "torch", "host"):
        assert key in final


def test_one_token_requests_and_stop_strings_end_where_the_engine_says(pd, mixed):
    # max_new_tokens=1 through PD: the prefill's only token travels in the aux row, and decode's
    # import applies the length limit at once
    one = generate(pd.url, PROMPT, 1)
    assert one["output_ids"] == generate(mixed.children[0].url, PROMPT, 1)["output_ids"]
    assert one["meta_info"]["finish_reason"] == {"type": "length", "length": 1}
    # the engine's text (its detokeniser, its stop strings) is the served text, on every route
    ids = [(i * 29 + 3) % 250 for i in range(40)]
    whole = generate(mixed.children[0].url, ids, 16)
    text = whole["text"]
    cut = next(i for i in range(4, len(text) - 2) if text[i:i + 2].isprintable()
               and text.find(text[i:i + 2]) == i)
    stop = text[cut:cut + 2]
    for url in (mixed.children[0].url, pd.url):
        out = generate(url, ids, 16, sampling_params={"max_new_tokens": 16, "temperature": 0,
                                                      "ignore_eos": True, "stop": [stop]})
        assert out["text"] == text[:cut], (url, out["text"], text, stop)
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    # (sglang-router refuses token-id prompts on /v1/completions: the worker's own route here)
    status, cmpl = http(f"{mixed.children[0].url}/v1/completions", {
        "prompt": ids, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stop": stop})
    assert status == 200 and cmpl["choices"][0]["text"] == text[:cut]
    assert cmpl["choices"][0]["finish_reason"] == "stop"
