"""Serving workloads: random prompts, and the generated-shared-prefix set of the reference
deployment's benchmark.

As in SGLang's ``generated-shared-prefix`` dataset (docs/techniques.md section 8): ``num_groups``
random
system prompts of ``system_prompt_len`` tokens, each followed by ``prompts_per_group`` random
questions of ``question_len`` tokens, joined as ``f"{system}\\n\\n{question}"``; lengths drawn
uniformly from ``[len * range_ratio, len]``; order shuffled unless ``ordered``. Prompts are text
(decoded from random token ids) unless ``as_ids``, in which case the exact ids are sent and
lengths are exact; text prompts are re-tokenized to measure their length.

Random ids are drawn only from tokens whose text encodes back to exactly that token, so a
byte-level tokenizer's partial UTF-8 bytes cannot turn one token into three.
This module knows a tokenizer and a seed; nothing about HTTP or servers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from glmlab.tokenizer import Tokenizer


@dataclass(frozen=True)
class BenchRequest:
    text: str | None
    input_ids: tuple[int, ...] | None
    prompt_len: int
    output_len: int
    group: int = -1  # shared-prefix group, -1 for none
    shared_len: int = 0  # tokens of the prompt shared with the rest of its group


def round_trip_vocab(tok: Tokenizer, limit: int = 200_000) -> list[int]:
    """Token ids that are not special and that re-encode alone to themselves."""
    out = []
    for i in range(min(tok.vocab_size, limit)):
        if i in tok.special_ids:
            continue
        s = tok.decode([i], skip_special_tokens=False)
        if s and "\ufffd" not in s and not s.isspace() and tok.encode(s) == [i]:
            out.append(i)
    if not out:
        raise ValueError("the tokenizer has no token that round-trips on its own")
    return out


def _length(rng: random.Random, n: int, ratio: float) -> int:
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"range_ratio must be in [0, 1], got {ratio}")
    return max(1, rng.randint(int(n * ratio), n)) if n > 0 else 0


def _make(tok: Tokenizer, ids: list[int], output_len: int, as_ids: bool, group: int = -1,
          shared: int = 0) -> BenchRequest:
    if as_ids:
        return BenchRequest(None, tuple(ids), len(ids), output_len, group, shared)
    text = tok.decode(ids, skip_special_tokens=False)
    return BenchRequest(text, None, len(tok.encode(text)), output_len, group, shared)


def random_requests(tok: Tokenizer, num_prompts: int, input_len: int, output_len: int,
                    range_ratio: float = 1.0, seed: int = 42,
                    as_ids: bool = False) -> list[BenchRequest]:
    rng, vocab = random.Random(seed), round_trip_vocab(tok)
    out = []
    for _ in range(num_prompts):
        ids = rng.choices(vocab, k=_length(rng, input_len, range_ratio))
        out.append(_make(tok, ids, _length(rng, output_len, range_ratio), as_ids))
    return out


def shared_prefix_requests(tok: Tokenizer, num_groups: int, prompts_per_group: int,
                           system_prompt_len: int, question_len: int, output_len: int,
                           range_ratio: float = 1.0, seed: int = 42, ordered: bool = False,
                           as_ids: bool = False) -> list[BenchRequest]:
    if num_groups < 1 or prompts_per_group < 1:
        raise ValueError("num_groups and prompts_per_group must be >= 1")
    rng, vocab = random.Random(seed), round_trip_vocab(tok)
    sep = tok.encode("\n\n")
    out = []
    for g in range(num_groups):
        system = rng.choices(vocab, k=_length(rng, system_prompt_len, range_ratio))
        for _ in range(prompts_per_group):
            question = rng.choices(vocab, k=_length(rng, question_len, range_ratio))
            ids = system + sep + question if system else question
            shared = len(system) + len(sep) if system else 0
            out.append(_make(tok, ids, _length(rng, output_len, range_ratio), as_ids, g, shared))
    if not ordered:
        rng.shuffle(out)
    return out
