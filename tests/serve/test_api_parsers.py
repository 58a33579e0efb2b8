"""GLM reasoning and tool-call parsers on GLM-format strings, whole and split at every point."""

from __future__ import annotations

import json

import pytest

from glmlab.serve.parsers import ChatParsers
from glmlab.serve.parsers.reasoning import ReasoningStream, split_reasoning
from glmlab.serve.parsers.tool_calls import ToolCallStream, call_grammar, parse_tool_calls

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}]
CALL47 = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>北京</arg_value>"
          "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>")
CALL45 = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
          "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>")


@pytest.mark.parametrize("text, in_reasoning, want", [
    ("<think>plan it</think>\n\nThe answer.", False, ("plan it", "The answer.")),
    ("plan it</think>The answer.", True, ("plan it", "The answer.")),
    ("No thinking here.", False, (None, "No thinking here.")),
    ("<think>still thinking", False, ("still thinking", "")),
    ("<think>I call it" + CALL47, False, ("I call it", CALL47)),
])
def test_reasoning_whole_and_every_split(text, in_reasoning, want):
    assert split_reasoning(text, in_reasoning) == want
    for cut in range(len(text) + 1):
        s = ReasoningStream(in_reasoning)
        parts = [s.feed(text[:cut]), s.feed(text[cut:], final=True)]
        assert "".join(p[0] for p in parts) == (want[0] or "")
        assert "".join(p[1] for p in parts) == want[1]


@pytest.mark.parametrize("call, city, days", [(CALL47, "北京", 3), (CALL45, "Paris", 2)])
def test_tool_calls_whole(call, city, days):
    content, calls = parse_tool_calls("Sure. " + call + call, TOOLS)
    assert content == "Sure. " and len(calls) == 2 and [c["index"] for c in calls] == [0, 1]
    fn = calls[0]["function"]
    assert fn["name"] == "get_weather" and json.loads(fn["arguments"]) == {"city": city,
                                                                          "days": days}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")


def test_tool_call_stream_token_by_token_equals_the_whole_parse():
    text = "Let me check. " + CALL47 + " done"
    for step in (1, 3, 7):
        s, content, deltas = ToolCallStream(TOOLS), "", []
        for i in range(0, len(text), step):
            c, d = s.feed(text[i:i + step])
            content, deltas = content + c, deltas + d
        c, d = s.feed("", final=True)
        content, deltas = content + c, deltas + d
        assert content == "Let me check.  done"
        assert deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
        args = "".join(d["function"].get("arguments", "") for d in deltas)
        assert json.loads(args) == {"city": "北京", "days": 3}
        assert "<" not in content  # no fragment of the tags leaked as text


def test_chat_parsers_combine_reasoning_and_calls():
    p = ChatParsers(reasoning=True, in_reasoning=False, tools=TOOLS)
    message, calls = p.whole("<think>weather?</think>" + CALL47)
    assert message["reasoning_content"] == "weather?" and message["content"] is None
    assert message["tool_calls"] == calls and calls[0]["function"]["name"] == "get_weather"
    s, got = p.stream(), []
    text = "<think>weather?</think>" + CALL47
    for ch in text:
        got.append(s.feed(ch))
    got.append(s.feed("", final=True))
    assert "".join(d.get("reasoning_content", "") for d in got) == "weather?"
    assert s.saw_calls and not "".join(d.get("content", "") for d in got)


def test_call_grammar_accepts_the_call_xgrammar_compiles():
    xgr = pytest.importorskip("xgrammar")
    ebnf = call_grammar(TOOLS, "get_weather")
    grammar = xgr.Grammar.from_ebnf(ebnf)
    assert xgr.testing._is_grammar_accept_string(grammar, CALL47)
    assert not xgr.testing._is_grammar_accept_string(grammar, CALL47.replace("3", "x"))
    with pytest.raises(ValueError, match="no tool"):
        call_grammar(TOOLS, "nope")


def _reduce(body: dict):
    from types import SimpleNamespace

    from glmlab.checkpoint.presets_dir import preset_checkpoint
    from glmlab.serve.chat import reduce
    from glmlab.serve.schemas import ChatBody
    from glmlab.tokenizer import Tokenizer

    card = SimpleNamespace(tokenizer=Tokenizer.from_dir(preset_checkpoint("tiny")))
    return reduce(ChatBody.model_validate({"model": "tiny", **body}), card)


def test_tools_reach_the_prompt_through_the_checkpoints_template():
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    (req,) = _reduce({"messages": msgs, "tools": TOOLS}).requests
    assert json.dumps(TOOLS[0]) in req.text  # listed in the system turn
    # the call replayed from its JSON-string arguments, the tool's answer after it
    assert ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
            "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call><|observation|>\n"
            "<tool_response>\nsunny\n</tool_response>") in req.text
    (none,) = _reduce({"messages": msgs[:1], "tools": TOOLS, "tool_choice": "none"}).requests
    assert "<tools>" not in none.text  # tool_choice none: the model is not shown them
    (named,) = _reduce({"messages": msgs[:1], "tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "get_weather"}}}).requests
    assert json.dumps(TOOLS[0]) in named.text and named.grammar is not None


@pytest.mark.parametrize("arguments", ['{"city": ', '["Paris"]'])
def test_tool_call_arguments_that_are_no_json_object_are_refused(arguments):
    from glmlab.serve.errors import RequestError

    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                                "function": {
                                                                    "name": "get_weather",
                                                                    "arguments": arguments}}]}]
    with pytest.raises(RequestError, match="function.arguments") as e:
        _reduce({"messages": msgs, "tools": TOOLS})
    assert e.value.param == "messages"
