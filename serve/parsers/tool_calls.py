"""GLM's tool-call format (what SGLang's ``glm47`` / ``glm45`` parsers read), to OpenAI tool calls.

    <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>

(GLM-4.5 writes newlines between the parts; both layouts parse.) A value is raw text when the
tool's schema says the argument is a string, else JSON (falling back to the raw text). Text
outside the calls is content. ``ToolCallStream`` turns a stream of content deltas into content
deltas and OpenAI ``tool_calls`` deltas: the call's id and name as soon as the name is complete,
its arguments (a JSON object string) when the call closes; text that could still begin a
``<tool_call>`` is held back. ``call_grammar`` writes the EBNF a ``required`` or named
``tool_choice`` constrains the output with. Knows strings and JSON only.
"""

from __future__ import annotations

import json
import re
import uuid

from glmlab.serve.parsers.reasoning import _held

START, END = "<tool_call>", "</tool_call>"
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _types(tools: list[dict], name: str) -> dict[str, str]:
    for t in tools or ():
        fn = t.get("function", t)
        if fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") or {}
            return {k: v.get("type", "string") for k, v in props.items() if isinstance(v, dict)}
    return {}


def _value(raw: str, kind: str):
    if kind == "string":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse_call(body: str, tools: list[dict]) -> dict:
    """The text between ``<tool_call>`` and ``</tool_call>`` -> {"name", "arguments" (JSON)}."""
    name = body.split("<arg_key>", 1)[0].strip()
    types = _types(tools, name)
    args = {k.strip(): _value(v.strip("\n"), types.get(k.strip(), "string"))
            for k, v in _ARG.findall(body)}
    return {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}


def _openai(call: dict, index: int) -> dict:
    return {"index": index, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": call}


def parse_tool_calls(text: str, tools: list[dict]) -> tuple[str, list[dict]]:
    """(content, OpenAI tool calls) of a whole output."""
    content, calls, at = "", [], 0
    while (i := text.find(START, at)) >= 0:
        j = text.find(END, i)
        if j < 0:
            break  # an unclosed call is left as text
        content += text[at:i]
        calls.append(_openai(parse_call(text[i + len(START):j], tools), len(calls)))
        at = j + len(END)
    return content + text[at:], calls


class ToolCallStream:
    def __init__(self, tools: list[dict]):
        self.tools, self.buf, self.calls = tools, "", 0
        self.inside, self.named = False, False
        self.current: dict | None = None

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        self.buf += text
        content, deltas = "", []
        while True:
            if not self.inside:
                i = self.buf.find(START)
                if i < 0:
                    keep = 0 if final else _held(self.buf, (START,))
                    content += self.buf[:len(self.buf) - keep]
                    self.buf = self.buf[len(self.buf) - keep:]
                    return content, deltas
                content += self.buf[:i]
                self.buf, self.inside, self.named = self.buf[i + len(START):], True, False
            body_end = self.buf.find(END)
            name_end = min([k for k in (self.buf.find("<arg_key>"), self.buf.find("\n", 1),
                                        body_end) if k >= 0] or [-1])
            if not self.named and name_end >= 0 and self.buf[:name_end].strip():
                self.current = _openai({"name": self.buf[:name_end].strip(), "arguments": ""},
                                       self.calls)
                deltas.append(self.current)
                self.named = True
            if body_end < 0:
                if final:  # never closed: what there is goes out as text
                    content += START + self.buf
                    self.buf = ""
                return content, deltas
            call = parse_call(self.buf[:body_end], self.tools)
            if not self.named:
                self.current = _openai({"name": call["name"], "arguments": ""}, self.calls)
                deltas.append(self.current)
            deltas.append({"index": self.calls, "function": {"arguments": call["arguments"]}})
            self.calls += 1
            self.buf, self.inside = self.buf[body_end + len(END):], False


def _literal(text: str) -> str:
    return json.dumps(text)  # an EBNF string literal (xgrammar reads JSON-style escapes)


def _value_rule(spec: dict) -> str:
    if "enum" in spec:
        return " | ".join(_literal(v if isinstance(v, str) else json.dumps(v))
                          for v in spec["enum"])
    kind = spec.get("type", "string")
    if kind == "integer":
        return '"-"? [1-9] [0-9]{0,5} | "0"'
    if kind == "number":
        return '"-"? [0-9]{1,6} ("." [0-9]{1,4})?'
    if kind == "boolean":
        return '"true" | "false"'
    return '[^<\\n]{1,32}'  # bounded: even a random model ends the value


def call_grammar(tools: list[dict], name: str | None = None) -> str:
    """EBNF of one GLM tool call of ``name`` (None: any of ``tools``), every required argument
    present, with values of their schema's type."""
    rules, alts = [], []
    for k, t in enumerate(tools):
        fn = t.get("function", t)
        if name is not None and fn.get("name") != name:
            continue
        params = fn.get("parameters") or {}
        props = params.get("properties") or {}
        parts = [_literal(fn["name"])]
        for j, key in enumerate(params.get("required", list(props))):
            rule = f"v{k}_{j}"
            rules.append(f"{rule} ::= {_value_rule(props.get(key, {}))}")
            parts.append(f'"<arg_key>" {_literal(key)} "</arg_key><arg_value>" {rule} '
                         f'"</arg_value>"')
        rules.append(f"call{k} ::= " + " ".join(parts))
        alts.append(f"call{k}")
    if not alts:
        raise ValueError(f"no tool named {name!r}")
    return "\n".join([f'root ::= "{START}" ({" | ".join(alts)}) "{END}"', *rules])
