"""Token ids -> text for one request: stable deltas for streaming, and stop strings.

Detokenization re-decodes the whole output each time (outputs are short next to prompts, and a
byte-level tokenizer can split a UTF-8 character across tokens). Text ending in a replacement
character, or that could still grow into a stop string, is held back until it is settled.

It knows a ``decode(ids) -> str`` function and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str], stops: tuple[str, ...] = (),
                 keep_stop: bool = False):
        self._decode, self._stops, self._keep_stop = decode, stops, keep_stop
        self.ids: list[int] = []
        self.text = ""  # everything settled so far (what has been or may be sent)
        self.matched_stop: str | None = None
        self._hold = max((len(s) for s in stops), default=1) - 1

    def add(self, new_ids: list[int], final: bool = False) -> str:
        """Append tokens; returns the newly settled text. After a stop string matches, the
        request must end (``matched_stop`` is set) and later tokens are ignored."""
        if self.matched_stop is not None:
            return ""
        self.ids.extend(new_ids)
        full = self._decode(self.ids)
        for s in self._stops:
            at = full.find(s)
            if at >= 0 and (self.matched_stop is None or at < full.find(self.matched_stop)):
                self.matched_stop = s
        if self.matched_stop is not None:
            at = full.find(self.matched_stop)
            full = full[: at + (len(self.matched_stop) if self._keep_stop else 0)]
            final = True
        settled = full if final else self._settled(full)
        if len(settled) <= len(self.text) or not settled.startswith(self.text):
            return ""
        delta, self.text = settled[len(self.text):], settled
        return delta

    def _settled(self, full: str) -> str:
        end = len(full)
        while end and full[end - 1] == "\ufffd":  # an incomplete UTF-8 character at the end
            end -= 1
        if self._stops:
            end = max(len(self.text), end - self._hold) if end > self._hold else len(self.text)
        return full[:end]
