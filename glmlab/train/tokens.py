"""Token streams and training windows.

A split becomes one stream: each file's tokens preceded by ``<|endoftext|>`` (so a window that
crosses a file boundary sees where the new file starts, and the first token of a file is
predicted from the separator, exactly as ``glmlab eval`` scores it). Training windows are drawn at
uniformly random offsets of the train stream; validation windows are the first ones of the
validation stream at a fixed stride, so every logged validation loss reads the same tokens.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from glmlab.presets import SMALL_SPECIALS

SEPARATOR = SMALL_SPECIALS["<|endoftext|>"]


def token_stream(tok: Tokenizer, texts: list[str], separator: int = SEPARATOR) -> torch.Tensor:
    """[N] int32: separator, file 1, separator, file 2, ..."""
    out: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        out.append(separator)
        out.extend(enc.ids)
    return torch.tensor(out, dtype=torch.int32)


class WindowSampler:
    """Random [B, L] windows of a stream, reproducible from the seed."""

    def __init__(self, stream: torch.Tensor, length: int, batch: int, seed: int):
        if stream.numel() <= length:
            raise ValueError(f"the stream has {stream.numel()} tokens, fewer than one window "
                             f"of {length}")
        self.stream, self.length, self.batch = stream, length, batch
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self) -> torch.Tensor:
        starts = torch.randint(0, self.stream.numel() - self.length, (self.batch,),
                               generator=self.gen)
        return torch.stack([self.stream[s:s + self.length] for s in starts.tolist()]).long()


def fixed_windows(stream: torch.Tensor, length: int, count: int) -> torch.Tensor:
    """Up to ``count`` windows [n, L] spread evenly over the stream."""
    last = stream.numel() - length
    if last < 0:
        raise ValueError(f"the stream has {stream.numel()} tokens, fewer than one window")
    n = min(count, last // max(1, length // 2) + 1)
    starts = torch.linspace(0, last, n).long().tolist()
    return torch.stack([stream[s:s + length] for s in starts]).long()
