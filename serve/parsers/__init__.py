"""Chat output parsers: GLM reasoning (``glm45``) and GLM tool calls (``glm47`` / ``glm45``).

``ChatParsers`` combines the two a request needs: ``whole(text)`` gives the OpenAI message
(``content``, ``reasoning_content``, ``tool_calls``); ``stream()`` a per-choice object whose
``feed(delta, final)`` gives the next OpenAI delta. Reasoning is split first (a ``<tool_call>``
also ends it), then calls are found in the content.
"""

from __future__ import annotations

from glmlab.serve.parsers.reasoning import ReasoningStream, split_reasoning
from glmlab.serve.parsers.tool_calls import ToolCallStream, parse_tool_calls

REASONING_PARSERS = ("glm45",)
TOOL_CALL_PARSERS = ("glm47", "glm45")


class _Stream:
    def __init__(self, p: ChatParsers):
        self.reasoning = ReasoningStream(p.in_reasoning) if p.reasoning else None
        self.tools = ToolCallStream(p.tools) if p.tools is not None else None
        self.saw_calls = False

    def feed(self, text: str, final: bool = False) -> dict:
        reasoning, content = (self.reasoning.feed(text, final) if self.reasoning
                              else ("", text))
        delta: dict = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        calls = []
        if self.tools is not None:
            content, calls = self.tools.feed(content, final)
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"], self.saw_calls = calls, True
        return delta


class ChatParsers:
    """``reasoning``: split ``<think>`` out (``in_reasoning``: the prompt opened it);
    ``tools``: the request's tools when calls are to be parsed (None: they are not)."""

    def __init__(self, reasoning: bool, in_reasoning: bool, tools: list[dict] | None):
        self.reasoning, self.in_reasoning, self.tools = reasoning, in_reasoning, tools

    def whole(self, text: str) -> tuple[dict, list[dict]]:
        message: dict = {"role": "assistant"}
        content = text
        if self.reasoning:
            reasoning, content = split_reasoning(text, self.in_reasoning)
            message["reasoning_content"] = reasoning
        calls = []
        if self.tools is not None:
            content, calls = parse_tool_calls(content, self.tools)
        message["content"] = content if content or not calls else None
        if calls:
            message["tool_calls"] = calls
        return message, calls

    def stream(self) -> _Stream:
        return _Stream(self)
