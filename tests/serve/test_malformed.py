"""Malformed and hostile input: every case gets a 4xx whose message names the field, at a mixed
worker's own port and at the service's one address (front, router, PD workers), and both keep
serving. Bodies over the cap are refused before they are read whole.

Prompt and sampling values are judged by the engine (``InvalidRequest``), the same checks ``LLM``
applies; the service adds the JSON and schema checks and the unsupported-feature refusals.
At the service, sglang-router judges some bodies first with its own typed schema (422, its own
words): there the test asks only for a 4xx naming the field. Only what stays invalid is asserted
(``n > 1``, logprobs, penalties... are features, not errors).
"""

from __future__ import annotations

import json
import select
import socket
import time
from http.client import HTTPConnection

import pytest

from tests.serve.conftest import http

GEN = "/generate"
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


def sp(**params) -> dict:
    return {"text": "a", "sampling_params": params}


CASES = [
    # (id, path, body (dict) or raw bytes, status at a worker, words at a worker, field named)
    # -- the body itself
    ("not-json", GEN, b"{not json", 400, "not valid JSON", "body"),
    ("empty-body", GEN, b"", 400, "not valid JSON", "body"),
    ("json-array", GEN, b"[1, 2]", 400, "must be a JSON object", "body"),
    ("json-string", CHAT, b'"hello"', 400, "must be a JSON object", "body"),
    ("invalid-utf8", GEN, b'{"text": "\xff\xfe caf\xc3"}', 400, "not valid UTF-8", "body"),
    ("raw-control-char", GEN, b'{"text": "a\x07b"}', 400, "control character", "body"),
    ("nan-literal", GEN, b'{"text": "a", "sampling_params": {"temperature": NaN}}', 400,
     "NaN is not a JSON number", "body"),
    ("lone-surrogate", GEN, b'{"text": "a\\ud800b"}', 400, "lone surrogate", "text"),
    ("surrogate-in-chat", CHAT, b'{"messages": [{"role": "user", "content": "\\udfff"}]}', 400,
     "lone surrogate", "content"),
    # -- /generate: the prompt
    ("no-prompt", GEN, {"sampling_params": {}}, 400, "exactly one of text or input_ids", "text"),
    ("text-and-ids", GEN, {"text": "a", "input_ids": [1]}, 400, "exactly one", "text"),
    ("batch-empty", GEN, {"text": []}, 400, "empty", "prompts"),
    ("text-number", GEN, {"text": 5}, 400, "text", "text"),
    ("text-object", GEN, {"text": {"a": 1}}, 400, "text", "text"),
    ("ids-strings", GEN, {"input_ids": ["a"]}, 400, "input_ids", "input_ids"),
    ("ids-floats", GEN, {"input_ids": [1.5, 2]}, 400, "input_ids", "input_ids"),
    ("ids-too-deep", GEN, {"input_ids": [[[1]]]}, 400, "input_ids", "input_ids"),
    ("ids-out-of-vocab", GEN, {"input_ids": [1, 10**9]}, 400, "token ids must be in [0, 320)",
     "token ids"),
    ("ids-negative", GEN, {"input_ids": [-1]}, 400, "token ids must be in [0, 320)",
     "token ids"),
    ("ids-huge-int", GEN, {"input_ids": [10**30]}, 400, "token ids must be in", "ids"),
    ("empty-text", GEN, {"text": ""}, 400, "empty", "prompt"),
    ("empty-ids", GEN, {"input_ids": []}, 400, "empty", "prompt"),
    ("prompt-over-context", GEN, {"input_ids": [1] * 4096}, 400, "the context holds 4096",
     "prompt"),
    ("over-context", GEN, {"input_ids": [1] * 10, "sampling_params": {"max_new_tokens": 10**6}},
     400, "exceeds the context length", "max_new_tokens"),
    ("unknown-model-generate", GEN, {"text": "a", "model": "gpt-4"}, 404, "not found", "model"),
    ("model-control-chars", GEN, {"text": "a", "model": "tiny\u0000\u001b[31m"}, 404,
     "not found", "model"),
    ("model-number", GEN, {"text": "a", "model": 5}, 400, "model", "model"),
    ("rid-number", GEN, {"text": "a", "rid": 5}, 400, "rid", "rid"),
    ("stream-string", GEN, {"text": "a", "stream": "yes"}, 400, "stream", "stream"),
    ("bootstrap-half", GEN, {"text": "a", "bootstrap_room": 5}, 400, "bootstrap",
     "bootstrap"),
    # -- /generate: sampling
    ("sampling-params-list", GEN, {"text": "a", "sampling_params": [1]}, 400, "sampling_params",
     "sampling_params"),
    ("sampling-params-string", GEN, {"text": "a", "sampling_params": "greedy"}, 400,
     "sampling_params", "sampling_params"),
    ("unknown-sampling-param", GEN, sp(temprature=0), 400, "temprature", "temprature"),
    ("temperature-string", GEN, sp(temperature="hot"), 400, "temperature", "temperature"),
    ("temperature-negative", GEN, sp(temperature=-1), 400, "temperature", "temperature"),
    ("temperature-infinite", GEN, b'{"text": "a", "sampling_params": {"temperature": 1e999}}',
     400, "temperature", "temperature"),
    ("top-p-zero", GEN, sp(top_p=0), 400, "top_p", "top_p"),
    ("top-p-above-one", GEN, sp(top_p=1.01), 400, "top_p", "top_p"),
    ("top-k-zero", GEN, sp(top_k=0), 400, "top_k", "top_k"),
    ("top-k-string", GEN, sp(top_k="all"), 400, "top_k", "top_k"),
    ("min-p-above-one", GEN, sp(min_p=2.0), 400, "min_p", "min_p"),
    ("max-new-float", GEN, sp(max_new_tokens=2.5), 400, "max_new_tokens", "max_new_tokens"),
    ("max-new-zero", GEN, sp(max_new_tokens=0), 400, "max_new_tokens", "max_new_tokens"),
    ("max-new-negative", GEN, sp(max_new_tokens=-5), 400, "max_new_tokens", "max_new_tokens"),
    ("max-new-huge", GEN, sp(max_new_tokens=10**30), 400, "max_new_tokens", "max_new_tokens"),
    ("n-zero", GEN, sp(n=0), 400, "n must be", "n"),
    ("n-negative", GEN, sp(n=-1), 400, "n must be", "n"),
    ("penalty-out-of-range", GEN, sp(presence_penalty=3.0), 400, "presence_penalty",
     "presence_penalty"),
    ("frequency-penalty-string", GEN, sp(frequency_penalty="lots"), 400, "frequency_penalty",
     "frequency_penalty"),
    ("repetition-penalty-zero", GEN, sp(repetition_penalty=0.0), 400, "repetition_penalty",
     "repetition_penalty"),
    ("bias-not-an-id", GEN, sp(logit_bias={"x": 1.0}), 400, "logit_bias", "logit_bias"),
    ("bad-regex", GEN, sp(regex="(("), 400, "regex", "regex"),
    ("empty-stop", GEN, sp(stop=[""]), 400, "stop", "stop"),
    ("stop-number", GEN, sp(stop=[1]), 400, "stop", "stop"),
    ("stop-nested", GEN, sp(stop=[["a"]]), 400, "stop", "stop"),
    ("stop-ids-strings", GEN, sp(stop_token_ids=["eos"]), 400, "stop_token_ids",
     "stop_token_ids"),
    ("seed-string", GEN, sp(seed="lucky"), 400, "seed", "seed"),
    ("ignore-eos-string", GEN, sp(ignore_eos="true"), 400, "ignore_eos", "ignore_eos"),
    ("return-logprob-string", GEN, {"text": "a", "return_logprob": "yes"}, 400,
     "return_logprob", "return_logprob"),
    ("top-logprobs-num-negative", GEN, {"text": "a", "return_logprob": True,
                                        "top_logprobs_num": -1}, 400, "logprobs", "logprobs"),
    ("top-logprobs-num-huge", GEN, {"text": "a", "return_logprob": True,
                                    "top_logprobs_num": 100}, 400, "logprobs", "logprobs"),
    ("logprob-start-string", GEN, {"text": "a", "logprob_start_len": "x"}, 400,
     "logprob_start_len", "logprob_start_len"),
    # -- /v1/completions
    ("cmpl-no-prompt", CMPL, {"model": "tiny"}, 400, "prompt", "prompt"),
    ("cmpl-prompt-number", CMPL, {"model": "tiny", "prompt": 5}, 400, "prompt", "prompt"),
    ("cmpl-prompt-null", CMPL, {"model": "tiny", "prompt": None}, 400, "prompt", "prompt"),
    ("cmpl-prompt-empty", CMPL, {"model": "tiny", "prompt": ""}, 400, "empty", "prompt"),
    ("cmpl-ids-out-of-vocab", CMPL, {"model": "tiny", "prompt": [5, 320]}, 400,
     "token ids must be in [0, 320)", "token ids"),
    ("cmpl-unknown-model", CMPL, {"model": "nope", "prompt": "a"}, 404, "nope", "model"),
    ("cmpl-max-tokens-negative", CMPL, {"model": "tiny", "prompt": "a", "max_tokens": -3}, 400,
     "max_new_tokens", "max_"),
    ("cmpl-max-tokens-string", CMPL, {"model": "tiny", "prompt": "a", "max_tokens": "ten"}, 400,
     "max_tokens", "max_tokens"),
    ("cmpl-over-context", CMPL, {"model": "tiny", "prompt": "a", "max_tokens": 10**6}, 400,
     "exceeds the context length", "max_"),
    ("cmpl-temperature-negative", CMPL, {"model": "tiny", "prompt": "a", "temperature": -0.5},
     400, "temperature", "temperature"),
    ("cmpl-n-zero", CMPL, {"model": "tiny", "prompt": "a", "n": 0}, 400, "n must be", "n"),
    ("cmpl-logprobs-negative", CMPL, {"model": "tiny", "prompt": "a", "logprobs": -3}, 400,
     "logprobs", "logprobs"),
    ("cmpl-logprobs-huge", CMPL, {"model": "tiny", "prompt": "a", "logprobs": 100}, 400,
     "logprobs", "logprobs"),
    ("cmpl-stop-numbers", CMPL, {"model": "tiny", "prompt": "a", "stop": [1, 2]}, 400, "stop",
     "stop"),
    ("cmpl-best-of", CMPL, {"model": "tiny", "prompt": "a", "best_of": 3}, 400, "best_of",
     "best_of"),
    ("cmpl-bad-format", CMPL, {"model": "tiny", "prompt": "a",
                               "response_format": {"type": "xml"}}, 400, "response_format",
     "response_format"),
    ("cmpl-user-number", CMPL, {"model": "tiny", "prompt": "a", "user": 7}, 400, "user", "user"),
    # -- /v1/chat/completions
    ("chat-no-messages", CHAT, {"model": "tiny", "messages": []}, 400, "messages", "messages"),
    ("chat-messages-missing", CHAT, {"model": "tiny"}, 400, "messages", "messages"),
    ("chat-messages-string", CHAT, {"model": "tiny", "messages": "hi"}, 400, "messages",
     "messages"),
    ("chat-message-no-role", CHAT, {"messages": [{"content": "x"}]}, 400, "role", "role"),
    ("chat-bad-role", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role",
     "role"),
    ("chat-content-number", CHAT, {"messages": [{"role": "user", "content": 3}]}, 400,
     "content", "content"),
    ("chat-content-part-image", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400, "content",
     "content"),
    ("chat-choice-no-tools", CHAT, {"messages": MSGS, "tool_choice": "required"}, 400,
     "needs tools", "tool"),
    ("chat-choice-unknown", CHAT, {"messages": MSGS, "tools": [{"type": "function",
     "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     400, "not one of the tools", "tool"),
    ("chat-tools-string", CHAT, {"messages": MSGS, "tools": "all"}, 400, "tools", "tools"),
    ("chat-top-p-big", CHAT, {"messages": MSGS, "top_p": 1.5}, 400, "top_p", "top_p"),
    ("chat-unknown-model", CHAT, {"model": "x", "messages": MSGS}, 404, "not found", "model"),
    ("chat-n-negative", CHAT, {"messages": MSGS, "n": -1}, 400, "n must be", "n"),
    ("chat-top-logprobs-huge", CHAT, {"messages": MSGS, "logprobs": True, "top_logprobs": 100},
     400, "logprobs", "logprobs"),
    ("chat-top-logprobs-negative", CHAT, {"messages": MSGS, "logprobs": True,
                                          "top_logprobs": -2}, 400, "logprobs", "logprobs"),
    ("chat-logprobs-string", CHAT, {"messages": MSGS, "logprobs": "yes"}, 400, "logprobs",
     "logprobs"),
    ("chat-max-completion-zero", CHAT, {"messages": MSGS, "max_completion_tokens": 0}, 400,
     "max_new_tokens", "max_"),
    ("chat-over-context", CHAT, {"messages": MSGS, "max_tokens": 10**6}, 400,
     "exceeds the context length", "max_"),
    ("chat-stop-number", CHAT, {"messages": MSGS, "stop": 5}, 400, "stop", "stop"),
    ("chat-bad-format", CHAT, {"messages": MSGS, "response_format": {"type": "xml"}}, 400,
     "response_format", "response_format"),
    ("chat-stream-options-bad", CHAT, {"messages": MSGS, "stream": True,
                                       "stream_options": {"include_usage": "yes"}}, 400,
     "include_usage", "include_usage"),
]


# not an error at the service: the router writes its own bootstrap fields over the client's
WORKER_ONLY = {"bootstrap-half"}


def send(url: str, body) -> tuple[int, dict]:
    got, out = http(url, raw=body) if isinstance(body, bytes) else http(url, body)
    assert isinstance(out, dict) and isinstance(out.get("error"), dict), (got, out)
    return got, out


@pytest.mark.parametrize("path, body, status, words, field", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_malformed_request_at_a_worker(mixed, path, body, status, words, field):
    got, out = send(mixed.children[0].url + path, body)
    assert got == status, out
    message = out["error"]["message"]
    assert words.lower() in message.lower() and field.lower() in message.lower(), message
    assert out["error"]["code"] == status


@pytest.mark.parametrize("path, body, field", [(c[1], c[2], c[5]) for c in CASES
                                                 if c[0] not in WORKER_ONLY],
                         ids=[c[0] for c in CASES if c[0] not in WORKER_ONLY])
def test_malformed_request_at_the_service(pd, path, body, field):
    got, out = send(pd.url + path, body)
    assert 400 <= got < 500, out
    assert field.lower() in out["error"]["message"].lower(), out


def test_escaped_control_characters_are_text(mixed, pd):
    """A NUL or ESC written as a JSON escape is a character like any other: served, not refused."""
    for url in (mixed.children[0].url, pd.url):
        status, out = http(url + GEN, {"text": "a\u0000b\u001b[0m\u0007", "sampling_params": {
            "max_new_tokens": 2, "temperature": 0, "ignore_eos": True}})
        assert status == 200 and out["meta_info"]["completion_tokens"] == 2, out


def declared_too_big(url: str) -> tuple[int, dict, float]:
    """Headers announcing 1 GiB, and not one byte of the body: the answer must come anyway."""
    conn = HTTPConnection(url.removeprefix("http://"), timeout=10)
    t = time.monotonic()
    conn.putrequest("POST", "/generate")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(1 << 30))
    conn.endheaders()
    resp = conn.getresponse()
    body = json.loads(resp.read())
    conn.close()
    return resp.status, body, time.monotonic() - t


def chunked_too_big(url: str, cap: int) -> tuple[bytes, int]:
    """A chunked body (no length) sent 1 MiB at a time: the 413 arrives after about the cap,
    while the client still has most of its 4x-the-cap body to send."""
    host, port = url.removeprefix("http://").split(":")
    chunk = b"x" * (1 << 20)
    sent = 0
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        while sent < 4 * cap:
            if select.select([s], [], [], 0)[0]:
                break  # the server answered (before the body ended)
            try:
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                break  # it stopped reading: its answer is waiting
            sent += len(chunk)
        try:
            return s.recv(4096), sent
        except ConnectionResetError:
            return b"", sent


def test_oversized_bodies_are_refused_before_they_are_read(mixed, pd):
    for url, cap in ((mixed.children[0].url, mixed.limits.max_body_bytes),
                     (pd.url, pd.limits.max_body_bytes)):
        status, body, waited = declared_too_big(url)
        assert status == 413, body
        assert body["error"]["param"] == "body" and str(cap) in body["error"]["message"], body
        assert waited < 5
        answer, sent = chunked_too_big(url, cap)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert sent < 3 * cap, sent  # refused well before the client was done sending


def test_service_keeps_serving_after_the_suite(mixed, pd):
    for url in (mixed.children[0].url, pd.url):
        for _ in range(2):
            status, out = http(url + GEN, {"text": "still here", "sampling_params": {
                "max_new_tokens": 3, "temperature": 0, "ignore_eos": True}})
            assert status == 200 and out["meta_info"]["completion_tokens"] == 3, out
    assert http(mixed.children[0].url + "/server_info")[1]["leak_check"] == "ok"
    assert all(r["leak_check"] == "ok" for r in http(pd.url + "/server_info")[1]["workers"])
