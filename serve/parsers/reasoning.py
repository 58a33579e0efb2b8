"""GLM's reasoning format: ``<think>reasoning</think>content``, whole or streamed (``glm45``).

The output may open with ``<think>`` (or start inside it when the chat template opened it in
the prompt: ``in_reasoning``); reasoning ends at ``</think>`` or at a ``<tool_call>`` (GLM calls a
tool straight from its thoughts). Streaming holds back only a tail that could still be the
start of one of those tags, so the concatenated deltas equal the whole parse for every way of
splitting the text. Knows strings only.
"""

from __future__ import annotations

THINK, END, TOOL = "<think>", "</think>", "<tool_call>"


def _held(text: str, tags: tuple[str, ...]) -> int:
    """How many trailing characters of ``text`` could begin one of ``tags``."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), 0, -1):
            if text.endswith(tag[:k]):
                best = max(best, k)
                break
    return best


class ReasoningStream:
    def __init__(self, in_reasoning: bool = False):
        self.state = "reasoning" if in_reasoning else "start"
        self.buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning, content) settled by ``text``; ``final``: the output ended."""
        self.buf += text
        reasoning, content = "", ""
        while True:
            if self.state == "start":
                lead = self.buf.lstrip()
                if lead.startswith(THINK):
                    self.buf, self.state = lead[len(THINK):], "reasoning"
                    continue
                if THINK.startswith(lead) and not final and lead:
                    return reasoning, content  # may still become <think>
                if not lead and not final:
                    return reasoning, content
                self.state = "content"
            if self.state == "reasoning":
                cut = [(i, t) for t in (END, TOOL) if (i := self.buf.find(t)) >= 0]
                if cut:
                    i, tag = min(cut)
                    reasoning += self.buf[:i]
                    self.buf = self.buf[i + len(tag):] if tag == END else self.buf[i:]
                    self.state = "after"
                    continue
                keep = 0 if final else _held(self.buf, (END, TOOL))
                reasoning += self.buf[:len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                return reasoning, content
            if self.state == "after":  # the newline(s) GLM writes after </think> are not content
                stripped = self.buf.lstrip("\n")
                if not stripped and not final:
                    self.buf = ""
                    return reasoning, content
                self.buf, self.state = stripped, "content"
            content += self.buf
            self.buf = ""
            return reasoning, content


def split_reasoning(text: str, in_reasoning: bool = False) -> tuple[str | None, str]:
    """(reasoning or None when there was none, content) of a whole output."""
    s = ReasoningStream(in_reasoning)
    reasoning, content = s.feed(text, final=True)
    had = in_reasoning or s.state != "content" or text.lstrip().startswith(THINK)
    return (reasoning if had else None), content
