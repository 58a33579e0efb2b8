"""The incremental detokeniser against the checkpoint tokenizer's own full decode (HF tokenizers):
the same text token by token, nothing shown that is taken back later, stop strings cut on new
text only, and a bounded amount of decoding per token."""

from __future__ import annotations

import random

import pytest

from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.core import SamplingParams
from glmlab.engine.detokenizer import Detokenizer
from glmlab.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_dir(preset_checkpoint("tiny"))  # byte-level: one token per byte


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text)


def _stream(tok, ids, params):
    detok, deltas = Detokenizer(tok, params), []
    for t in ids:
        stop = detok.add(t)
        deltas.append(detok.take(final=stop is not None))
        if stop is not None:
            break
    else:
        deltas.append(detok.take(final=True))
    return detok, deltas


@pytest.mark.parametrize("seed", range(6))
def test_streamed_text_equals_the_full_decode(tok, seed):
    """Random mixes of ASCII, multi-byte characters split over tokens, invalid bytes and special
    tokens: the deltas add up to decode(ids), and every prefix of them stays a prefix of it."""
    rng = random.Random(seed)
    pieces = ["a", " b", "é", "€", "日本", "😀", "\n"]
    ids: list[int] = []
    for _ in range(60):
        r = rng.random()
        if r < 0.7:
            ids += _ids(tok, rng.choice(pieces))
        elif r < 0.85:
            ids.append(rng.randrange(128, 256))  # a stray continuation / lead byte
        else:
            ids.append(rng.choice(sorted(tok.special_ids)))
    for skip in (True, False):
        params = SamplingParams(skip_special_tokens=skip)
        _, deltas = _stream(tok, ids, params)
        full = tok.decode(ids, skip_special_tokens=skip)
        assert "".join(deltas) == full
        shown = ""
        for d in deltas[:-1]:
            shown += d
            assert full.startswith(shown)


def test_a_split_character_waits_for_its_last_byte(tok):
    detok = Detokenizer(tok, SamplingParams())
    b = list("€".encode())
    assert [detok.add(t) for t in b] == [None, None, None]
    assert detok.take() == "€"
    detok.add(b[0])
    assert detok.take() == ""  # an incomplete character is never shown
    assert detok.take(final=True) == tok.decode([b[0]])


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_are_held_back_then_cut(tok, include):
    text = "one two thr three four"
    params = SamplingParams(stop=("three", "fou"), include_stop_str=include)
    detok, deltas = _stream(tok, _ids(tok, text), params)
    assert detok.matched == "three"
    want = "one two thr three" if include else "one two thr "
    assert "".join(deltas) == want
    shown = ""
    for d in deltas:  # never shows text that is later cut ("thr" could begin "three")
        shown += d
        assert want.startswith(shown)


def test_a_stop_string_across_tokens_and_old_text(tok):
    detok = Detokenizer(tok, SamplingParams(stop=("xyz",)))
    for t in _ids(tok, "abxy"):
        assert detok.add(t) is None
    assert detok.take() == "ab"  # "xy" could still be the start of the stop string
    assert detok.add(_ids(tok, "z")[0]) == "xyz"
    assert detok.take(final=True) == ""
    assert detok.text == "ab"


def test_decoding_work_per_token_is_bounded(tok):
    """Each token decodes a window of a few ids, not the whole output (no O(n^2))."""
    calls = []

    class Counting:
        def decode(self, ids, skip_special_tokens=True):
            calls.append(len(ids))
            return tok.decode(ids, skip_special_tokens)

    n = 3000
    detok = Detokenizer(Counting(), SamplingParams(stop=("never",)))
    for t in _ids(tok, "the quick brown fox é " * (n // 22 + 1))[:n]:
        detok.add(t)
    assert len(detok.text) > n * 0.9
    assert sum(calls) <= 6 * n
