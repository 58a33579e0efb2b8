"""The tiny tokenizer round-trips text, and transformers reads the same files the same way."""

from __future__ import annotations

import json

from glmlab.checkpoint.tokenizer import TINY_SPECIALS
from glmlab.tokenizer import Tokenizer


def test_round_trip_and_specials(tiny_dir):
    tok = Tokenizer.from_dir(tiny_dir)
    text = "Hello, GLM! ünïcødé 你好 \n\t end"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and all(i < 256 for i in ids)
    assert tok.encode("<|user|>") == [TINY_SPECIALS["<|user|>"]]
    assert tok.eos_token_ids == (256, 263, 265)
    chat = tok.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    assert chat == "[gMASK]<sop><|system|>\nbe brief<|user|>\nhi<|assistant|>\n"


def test_transformers_agrees(tiny_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_dir))
    ours = Tokenizer.from_dir(tiny_dir)
    for text in ("plain ascii", "naïve café", "<|assistant|>\nok"):
        assert hf.encode(text, add_special_tokens=False) == ours.encode(text)
    msgs = [{"role": "user", "content": "hi"}]
    assert hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
        ours.apply_chat_template(msgs)
    )


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Météo du jour",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}}]


def test_tools_render_in_a_system_turn_as_glm_does(tiny_dir):
    """GLM-4.5/4.7's layout: the tools as JSON lines inside <tools></tools> in a system turn of
    their own, then the call format; an assistant turn replays its calls, consecutive tool
    results share one <|observation|>; transformers renders the same files the same way."""
    from transformers import AutoTokenizer

    ours = Tokenizer.from_dir(tiny_dir)
    msgs = [{"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
            {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "22C"}]
    chat = ours.apply_chat_template(msgs, tools=TOOLS)
    tools_json = json.dumps(TOOLS[0], ensure_ascii=False)
    assert chat.startswith("[gMASK]<sop><|system|>\n# Tools\n")
    assert f"<tools>\n{tools_json}\n</tools>" in chat  # unescaped, one line per tool
    assert "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key>" in chat
    assert chat.endswith(
        "<|user|>\nweather in Paris?<|assistant|>\n<tool_call>get_weather<arg_key>city</arg_key>"
        "<arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
        "<|observation|>\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22C\n"
        "</tool_response><|assistant|>\n")
    hf = AutoTokenizer.from_pretrained(str(tiny_dir))
    assert hf.apply_chat_template(msgs, tools=TOOLS, tokenize=False,
                                  add_generation_prompt=True) == chat
    assert ours.apply_chat_template(msgs[:1]) == "[gMASK]<sop><|user|>\nweather in Paris?" \
                                                 "<|assistant|>\n"  # no tools: no system turn
