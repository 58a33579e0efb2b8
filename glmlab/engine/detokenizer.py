"""One request's output ids -> text, a token at a time, with stop strings matched on new text only.

Each token decodes a short window (the ids since the last settled text, plus the one before it,
so a byte-level tokenizer can join a UTF-8 character split across tokens): the work per token
does not grow with the output. A window whose text ends in a replacement character is an
incomplete character and waits for the next token. Stop strings are searched in the new text and
the few characters before it that could start one; text that could still turn out to start a stop
string is held back from ``take`` until it is settled, so a stream never shows text that is cut
later. A matched stop string is cut from the text (kept with ``include_stop_str``).

The engine owns one per request (``Engine``); it knows a tokenizer's ``decode`` and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from glmlab.core import SamplingParams


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class Detokenizer:
    def __init__(self, tokenizer: Decoder, params: SamplingParams):
        self._tok, self._skip = tokenizer, params.skip_special_tokens
        self._stops, self._include = tuple(params.stop), params.include_stop_str
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self.ids: list[int] = []
        self._start = 0  # window start: one token before the first unsettled one
        self._read = 0  # ids before this are in ``text``
        self._before = ""  # decode(ids[_start:_read])
        self.text = ""  # the output text so far (cut at a matched stop string)
        self.matched: str | None = None
        self._sent = 0  # characters of ``text`` handed out by ``take``

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=self._skip)

    def add(self, token: int, can_stop: bool = True) -> str | None:
        """Feed one output token; returns the stop string it completed, if any (never while
        ``can_stop`` is false: before a request's ``min_new_tokens``)."""
        if self.matched is not None:
            return self.matched
        self.ids.append(token)
        now = self._decode(self.ids[self._start:])
        if len(now) <= len(self._before) or now.endswith("\ufffd"):
            return None  # nothing visible yet, or an incomplete character: wait for more
        search_from = max(0, len(self.text) - self._hold)
        self.text += now[len(self._before):]
        self._start, self._read = len(self.ids) - 1, len(self.ids)
        self._before = self._decode(self.ids[self._start:])
        return self._match(search_from) if can_stop else None

    def _match(self, search_from: int) -> str | None:
        hits = [(at, s) for s in self._stops if (at := self.text.find(s, search_from)) >= 0]
        if not hits:
            return None
        at, stop = min(hits)
        self.text = self.text[: at + (len(stop) if self._include else 0)]
        self.matched = stop
        return stop

    def take(self, final: bool = False) -> str:
        """The text settled since the last call; ``final``: everything (the request ended)."""
        if final and self.matched is None and self._read < len(self.ids):
            self.text += self._decode(self.ids[self._start:])[len(self._before):]
            self._start = self._read = len(self.ids)
            self._before = ""
        end = len(self.text)
        if not final and self.matched is None and self._stops:
            end = max(self._sent, end - self._hold)
        delta, self._sent = self.text[self._sent:end], max(self._sent, end)
        return delta
