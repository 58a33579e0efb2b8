"""The serving API through the official ``openai`` client and /generate, on a 1P1D service (tiny
model, CPU, NIXL over UCX TCP) started once for the module with GLM's parsers on."""

from __future__ import annotations

import json

import pytest

from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.serve.config import Role, ServeConfig, TransferConfig
from glmlab.serve.router import free_ports
from glmlab.serve.supervisor import Service
from tests.serve.conftest import ENGINE, http

openai = pytest.importorskip("openai")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"]}}}]
MSGS = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    router, metrics, prefill, boot, decode = free_ports(5)
    cfg = ServeConfig(port=router, router_metrics_port=metrics, prefill_ports=(prefill,),
                      bootstrap_ports=(boot,), decode_ports=(decode,),
                      log_dir=str(tmp_path_factory.mktemp("conf")), startup_timeout_s=120,
                      reasoning_parser="glm45", tool_call_parser="glm47",
                      transfer=TransferConfig(transfer_timeout_s=20, peer_check_interval_s=0.2))
    with Service(cfg, preset_checkpoint("tiny"), "tiny",
                 {Role.PREFILL: ENGINE, Role.DECODE: ENGINE}, quiet=True) as s:
        yield s


@pytest.fixture(scope="module")
def client(svc):
    return openai.OpenAI(base_url=f"{svc.url}/v1", api_key="none", max_retries=0)


def test_completions_n_seed_logprobs_and_penalties(client):
    out = client.completions.create(model="tiny", prompt="Hello", max_tokens=5, n=2, seed=4,
                                    temperature=1.0, logprobs=3, frequency_penalty=0.5,
                                    presence_penalty=0.2, extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1]
    assert out.usage.completion_tokens == 10
    assert 0 < out.usage.prompt_tokens < 10  # the prompt once, not once per sample
    for c in out.choices:
        assert len(c.logprobs.token_logprobs) == 5
        assert all(len(t) <= 3 for t in c.logprobs.top_logprobs)
    again = client.completions.create(model="tiny", prompt="Hello", max_tokens=5, n=2, seed=4,
                                      temperature=1.0, frequency_penalty=0.5,
                                      presence_penalty=0.2, extra_body={"ignore_eos": True})
    assert [c.text for c in again.choices] == [c.text for c in out.choices]  # seeded


def test_logit_bias_and_streaming_equal_to_whole(client):
    out = client.completions.create(model="tiny", prompt="Hi", max_tokens=4, temperature=0,
                                    logit_bias={"42": 100}, extra_body={"ignore_eos": True})
    assert out.choices[0].text == "****"  # token 42 is "*" in the tiny vocabulary
    whole = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=6,
                                           temperature=0, extra_body={"ignore_eos": True})
    stream = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=6,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == whole.choices[0].message.content  # greedy: a stream is the whole answer


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_choice_gives_a_well_formed_call(client, stream):
    kw = dict(model="tiny", messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=300,
              temperature=0.8, seed=1)
    if not stream:
        out = client.chat.completions.create(**kw)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls"
        call = choice.message.tool_calls[0]
        name, args = call.function.name, call.function.arguments
    else:
        name, args = None, ""
        for ch in client.chat.completions.create(stream=True, **kw):
            for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                name = d.function.name or name
                args += d.function.arguments or ""
    assert name == "get_weather"
    parsed = json.loads(args)
    assert set(parsed) == {"city", "unit"} and parsed["unit"] in ("c", "f")


def test_response_format_json_schema(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                               "size": {"enum": [1, 2, 3]}},
              "required": ["ok", "size"], "additionalProperties": False}
    out = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=60, temperature=0.7, seed=2,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    value = json.loads(out.choices[0].message.content)
    assert set(value) == {"ok", "size"} and value["size"] in (1, 2, 3)


def test_generate_batch_of_ids_with_top_logprobs_through_the_router(svc):
    status, out = http(f"{svc.url}/generate", {
        "input_ids": [[1, 2, 3, 4], [5, 6, 7]], "return_logprob": True, "top_logprobs_num": 2,
        "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}})
    assert status == 200 and isinstance(out, list) and len(out) == 2, out
    for o in out:
        lps = o["meta_info"]["output_token_logprobs"]
        assert [t for _, t, _ in lps] == o["output_ids"] and len(lps) == 3
        tops = o["meta_info"]["output_top_logprobs"]
        # PD: the first token's alternatives come from the prefill in its aux row
        assert len(tops) == 3 and all(len(t) == 2 and t[0][0] >= t[1][0] for t in tops)
    status, out = http(f"{svc.url}/generate", {
        "text": "abc", "sampling_params": {"max_new_tokens": 3, "n": 3, "temperature": 1.0,
                                           "ignore_eos": True}})
    assert status == 200 and len(out) == 3, out


def test_named_tool_choice_with_the_tools_in_the_prompt_then_the_result(client):
    plain = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=1,
                                           temperature=0)
    out = client.chat.completions.create(
        model="tiny", messages=MSGS, tools=TOOLS, max_tokens=300, temperature=0.8, seed=3,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    # the tiny tokenizer is byte-level: the tools' system turn adds a token per byte at least
    assert out.usage.prompt_tokens - plain.usage.prompt_tokens >= len(json.dumps(TOOLS[0]))
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city", "unit"}
    turn = choice.message.model_dump(exclude_none=True)  # arguments as a JSON string
    follow = client.chat.completions.create(
        model="tiny", tools=TOOLS, max_tokens=4, temperature=0,
        messages=MSGS + [turn, {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
    assert follow.usage.prompt_tokens > out.usage.prompt_tokens + len("sunny")
