"""Chat requests: messages, tools and the thinking switch through the checkpoint's chat template.

``reduce(body, card)`` renders the messages (with ``tools`` and ``chat_template_kwargs`` such
as ``enable_thinking`` handed to the template: GLM's lists the tools in a system turn, and
replays an assistant's calls from their arguments, decoded from JSON here) and reduces the body
to a ``GenBatch``; a ``required`` or named ``tool_choice`` becomes a grammar
(serve/parsers/tool_calls.py) so the output is a well-formed call whatever the model. ``parsers_for(body, card)`` picks the output
parsers the service was started with (``--reasoning-parser``, ``--tool-call-parser``).
"""

from __future__ import annotations

import json

from glmlab.serve.errors import RequestError
from glmlab.serve.parsers import ChatParsers
from glmlab.serve.parsers.tool_calls import call_grammar
from glmlab.serve.schemas import ChatBody, GenBatch, GrammarSpec, from_chat


def _messages(body: ChatBody) -> list[dict]:
    out = []
    for m in body.messages:
        d = {"role": m.role, "content": m.text()}
        for key in ("reasoning_content", "tool_calls", "tool_call_id", "name"):
            if getattr(m, key) is not None:
                d[key] = getattr(m, key)
        if "tool_calls" in d:
            d["tool_calls"] = [_call_with_mapping(c) for c in d["tool_calls"]]
        out.append(d)
    return out


def _call_with_mapping(call):
    """An OpenAI tool call whose ``arguments`` (a JSON string on the wire) is a mapping, as GLM's
    template iterates over them (SGLang decodes them the same way before rendering)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        args = json.loads(fn["arguments"])
    except ValueError:
        raise RequestError("a tool call's function.arguments must be a JSON object string",
                           param="messages") from None
    if not isinstance(args, dict):
        raise RequestError("a tool call's function.arguments must be a JSON object string",
                           param="messages")
    return {**call, "function": {**fn, "arguments": args}}


def _tool_choice(body: ChatBody) -> tuple[str, str | None]:
    """(mode: none | auto | required | named, the named function)."""
    choice = body.tool_choice
    if choice is None:
        return ("auto" if body.tools else "none"), None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise RequestError(f"tool_choice {choice!r}: choose none, auto, required or "
                               "a function", param="tool_choice")
        return choice, None
    name = (choice.get("function") or {}).get("name")
    if choice.get("type") != "function" or not isinstance(name, str):
        raise RequestError("tool_choice must name a function: {'type': 'function', "
                           "'function': {'name': ...}}", param="tool_choice")
    return "named", name


def reduce(body: ChatBody, card) -> GenBatch:
    mode, name = _tool_choice(body)
    tools = body.tools or []
    if mode in ("required", "named") and not tools:
        raise RequestError(f"tool_choice {mode} needs tools", param="tool_choice")
    names = [(t.get("function") or {}).get("name") for t in tools]
    if name is not None and name not in names:
        raise RequestError(f"tool_choice names {name!r}, not one of the tools {names}",
                           param="tool_choice")
    kwargs = dict(body.chat_template_kwargs or {})
    if tools and mode != "none":
        kwargs["tools"] = tools
    prompt = card.tokenizer.apply_chat_template(
        _messages(body), add_generation_prompt=not body.continue_final_message, **kwargs)
    grammar = None
    if mode in ("required", "named"):
        grammar = GrammarSpec("ebnf", call_grammar(tools, name))
    return from_chat(body, prompt, grammar, {"tool_mode": mode,
                                             "in_reasoning": prompt.rstrip().endswith("<think>")})


def parsers_for(body: ChatBody, wc) -> ChatParsers | None:
    reasoning = bool(getattr(wc, "reasoning_parser", "")) and body.separate_reasoning
    mode, _ = _tool_choice(body)
    tools = (body.tools or []) if mode != "none" and (
        getattr(wc, "tool_call_parser", "") or mode in ("required", "named")) else None
    if not reasoning and tools is None:
        return None
    kwargs = body.chat_template_kwargs or {}
    thinking = kwargs.get("enable_thinking", kwargs.get("thinking", True))
    return ChatParsers(reasoning and thinking is not False, False, tools)
