"""Malformed input: every case gets a 4xx naming the problem, and the server keeps serving.

Prompt and sampling values are judged by the engine (``InvalidRequest``), the same checks ``LLM``
applies; the service adds the JSON and schema checks and the unsupported-feature refusals."""

from __future__ import annotations

import pytest

from tests.serve.conftest import http

GEN = "/generate"
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
OK_MSGS = [{"role": "user", "content": "hi"}]

CASES = [
    # (id, path, body (dict) or raw bytes, expected status, words the message must contain)
    ("not-json", GEN, b"{not json", 400, "not valid JSON"),
    ("empty-body", GEN, b"", 400, "not valid JSON"),
    ("json-array", GEN, b"[1, 2]", 400, "must be a JSON object"),
    ("no-prompt", GEN, {"sampling_params": {}}, 400, "exactly one of text or input_ids"),
    ("text-and-ids", GEN, {"text": "a", "input_ids": [1]}, 400, "exactly one"),
    ("batch-empty", GEN, {"text": []}, 400, "empty"),
    ("text-number", GEN, {"text": 5}, 400, "text"),
    ("ids-strings", GEN, {"input_ids": ["a"]}, 400, "input_ids"),
    ("ids-out-of-vocab", GEN, {"input_ids": [1, 10**9]}, 400, "token ids must be in [0, 320)"),
    ("ids-negative", GEN, {"input_ids": [-1]}, 400, "token ids must be in [0, 320)"),
    ("empty-text", GEN, {"text": ""}, 400, "empty"),
    ("temperature-string", GEN, {"text": "a", "sampling_params": {"temperature": "hot"}}, 400,
     "temperature"),
    ("temperature-negative", GEN, {"text": "a", "sampling_params": {"temperature": -1}}, 400,
     "temperature"),
    ("top-p-zero", GEN, {"text": "a", "sampling_params": {"top_p": 0}}, 400, "top_p"),
    ("top-k-zero", GEN, {"text": "a", "sampling_params": {"top_k": 0}}, 400, "top_k"),
    ("max-new-float", GEN, {"text": "a", "sampling_params": {"max_new_tokens": 2.5}}, 400,
     "max_new_tokens"),
    ("max-new-zero", GEN, {"text": "a", "sampling_params": {"max_new_tokens": 0}}, 400,
     "max_new_tokens"),
    ("unknown-sampling-param", GEN, {"text": "a", "sampling_params": {"temprature": 0}}, 400,
     "temprature"),
    ("sampling-params-list", GEN, {"text": "a", "sampling_params": [1]}, 400, "sampling_params"),
    ("penalty-out-of-range", GEN, {"text": "a", "sampling_params": {"presence_penalty": 3.0}},
     400, "presence_penalty"),
    ("n-zero", GEN, {"text": "a", "sampling_params": {"n": 0}}, 400, "n must be"),
    ("bias-not-an-id", GEN, {"text": "a", "sampling_params": {"logit_bias": {"x": 1.0}}}, 400,
     "logit_bias"),
    ("bad-regex", GEN, {"text": "a", "sampling_params": {"regex": "(("}}, 400, "regex"),
    ("empty-stop", GEN, {"text": "a", "sampling_params": {"stop": [""]}}, 400, "stop"),
    ("stream-string", GEN, {"text": "a", "stream": "yes"}, 400, "stream"),
    ("over-context", GEN, {"input_ids": [1] * 10, "sampling_params": {"max_new_tokens": 10**6}},
     400, "exceeds the context length"),
    ("prompt-over-context", GEN, {"input_ids": [1] * 4096}, 400, "the context holds 4096"),
    ("cmpl-ids-out-of-vocab", CMPL, {"prompt": [5, 320]}, 400, "token ids must be in [0, 320)"),
    ("unknown-model-generate", GEN, {"text": "a", "model": "gpt-4"}, 404, "not found"),
    ("bootstrap-half", GEN, {"text": "a", "bootstrap_room": 5}, 400, "bootstrap"),
    ("cmpl-no-prompt", CMPL, {"model": "tiny"}, 400, "prompt"),
    ("cmpl-unknown-model", CMPL, {"model": "nope", "prompt": "a"}, 404, "nope"),
    ("cmpl-max-tokens-negative", CMPL, {"prompt": "a", "max_tokens": -3}, 400, "max_new_tokens"),
    ("cmpl-best-of", CMPL, {"prompt": "a", "best_of": 3}, 400, "best_of"),
    ("cmpl-bad-format", CMPL, {"prompt": "a", "response_format": {"type": "xml"}}, 400,
     "response_format"),
    ("chat-no-messages", CHAT, {"model": "tiny", "messages": []}, 400, "messages"),
    ("chat-bad-role", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("chat-content-number", CHAT, {"messages": [{"role": "user", "content": 3}]}, 400,
     "content"),
    ("chat-choice-no-tools", CHAT, {"messages": OK_MSGS, "tool_choice": "required"}, 400,
     "needs tools"),
    ("chat-choice-unknown", CHAT, {"messages": OK_MSGS, "tools": [{"type": "function",
     "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     400, "not one of the tools"),
    ("chat-top-p-big", CHAT, {"messages": OK_MSGS, "top_p": 1.5}, 400, "top_p"),
    ("chat-unknown-model", CHAT, {"model": "x", "messages": OK_MSGS}, 404, "not found"),
]


@pytest.mark.parametrize("path, body, status, words", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_malformed_request_gets_a_clear_4xx(mixed, path, body, status, words):
    url = mixed.children[0].url + path
    got, out = http(url, raw=body) if isinstance(body, bytes) else http(url, body)
    assert got == status, out
    message = out["error"]["message"]
    assert words.lower() in message.lower(), message
    assert out["error"]["code"] == status


def test_server_keeps_serving_after_the_suite(mixed):
    url = mixed.children[0].url
    for _ in range(2):
        status, out = http(url + GEN, {"text": "still here", "sampling_params": {
            "max_new_tokens": 3, "temperature": 0, "ignore_eos": True}})
        assert status == 200 and out["meta_info"]["completion_tokens"] == 3
    assert http(url + "/server_info")[1]["leak_check"] == "ok"


def test_router_passes_worker_errors_through(pd):
    status, out = http(pd.url + GEN, {"text": "a", "sampling_params": {"temperature": -1}})
    assert 400 <= status < 500, out
    status, out = http(pd.url + GEN, {"text": "ok", "sampling_params": {
        "max_new_tokens": 2, "ignore_eos": True}})
    assert status == 200
