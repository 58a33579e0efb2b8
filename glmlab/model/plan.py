"""ForwardPlan: everything a forward step needs to know about its batch, built once per step.

A step runs N sequences; sequence i brings ``seq_lens[i]`` new tokens on top of ``cache_lens[i]``
tokens already in the cache. Tokens of all sequences are concatenated (no padding): the model sees
[T, ...] tensors with T = sum(seq_lens), split by ``cu_seqlens``.

Where things live:
- per-token cache rows (DSA latent, indexer keys) are addressed by *token slots*:
  slot = page_table[i, pos // page_size] * page_size + pos % page_size;
- per-request state (KDA recurrent + conv state, the indexer's incomplete-pool tail) by
  ``state_slots[i]``.

The plan holds no model tensors and is never mutated; every layer reads the same plan.
``StepPlan`` wraps it with the input ids, the rows whose logits are wanted and the layers to
capture: what one forward call takes (``glmlab.model.session.run_step``); ``StepResult`` is what
it returns.

A speculative *verify* step carries a ``VerifyRecorder`` (``glmlab.speculative.commit``): the
KDA and DSA layers hand it the per-step inputs of their carried state and leave the committed KDA
state untouched, so the state can later be committed to whatever prefix of the window was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import torch


class VerifyRecorder(Protocol):
    """What a verify step records (every sequence verifies the same number of tokens)."""

    def record_conv(self, layer: int, slots: torch.Tensor, held: torch.Tensor,
                    x: torch.Tensor) -> None:
        """held [N, C, W-1] conv state before the window; x [T, C] the window's conv inputs."""

    def kda_recurrence(self, layer: int, slots: torch.Tensor, q, k, v, g, beta,
                       states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs o [T, H, V] over the window, and the states to store (the committed ones)."""

    def record_index_rows(self, layer: int, slot: torch.Tensor, held: int,
                          rows: torch.Tensor) -> None:
        """rows [held + n, 2*DI]: the incomplete pool's held rows, then the window's rows."""


@dataclass(frozen=True)
class ForwardPlan:
    seq_lens: tuple[int, ...]
    cache_lens: tuple[int, ...]
    state_slots: torch.Tensor  # [N] int64
    page_size: int
    write_slots: torch.Tensor  # [T] slots of the new tokens, in batch order
    cu_seqlens: torch.Tensor  # [N+1] int64
    verify: VerifyRecorder | None = None  # set only for speculative verify steps
    # Device copies of the lengths for paths that must not read host lists (fused uniform steps,
    # CUDA graphs): the page table the slots came from and each new token's absolute position.
    page_table: torch.Tensor | None = None  # [N, max_pages] int64
    positions: torch.Tensor | None = None  # [T] int64

    @classmethod
    def build(cls, seq_lens: list[int], cache_lens: list[int], state_slots: list[int],
              page_table: torch.Tensor, page_size: int,
              verify: VerifyRecorder | None = None) -> ForwardPlan:
        """page_table: [N, max_pages] page ids (only the first ceil(len / page_size) are read).

        A fixed number of launches whatever N: the host lengths go to the device in one copy
        and every token's slot comes from one gather of the page table."""
        n = len(seq_lens)
        if not (n == len(cache_lens) == len(state_slots) == page_table.shape[0]):
            raise ValueError("seq_lens, cache_lens, state_slots and page_table disagree on N")
        lens, cached = torch.tensor(seq_lens, dtype=torch.long), torch.tensor(cache_lens,
                                                                             dtype=torch.long)
        cu = torch.zeros(n + 1, dtype=torch.long)
        torch.cumsum(lens, 0, out=cu[1:])
        seq_of = torch.repeat_interleave(torch.arange(n), lens)  # [T]
        positions = torch.arange(int(cu[-1])) - cu[:-1][seq_of] + cached[seq_of]  # [T]
        host = torch.cat([positions, seq_of, torch.tensor(state_slots, dtype=torch.long), cu])
        dev = host.to(page_table.device)  # one copy of every length the step needs
        t = positions.numel()
        positions, seq_of = dev[:t], dev[t:2 * t]
        table = page_table.long()
        return cls(
            seq_lens=tuple(seq_lens),
            cache_lens=tuple(cache_lens),
            state_slots=dev[2 * t:2 * t + n],
            page_size=page_size,
            write_slots=_slots(table, seq_of, positions, page_size),
            cu_seqlens=dev[2 * t + n:],
            verify=verify,
            page_table=table,
            positions=positions,
        )

    @cached_property
    def context_slots(self) -> tuple[torch.Tensor, ...]:
        """Per sequence, the token slots of its whole context (cached + new): [cache_len +
        seq_len] each. Built on first use, for the paths that gather by context position (the
        torch references); the fused paths address the cache through ``page_table``."""
        if self.page_table is None:
            raise ValueError("this plan has no page table to derive context slots from")
        sizes = [c + n for n, c in zip(self.seq_lens, self.cache_lens, strict=True)]
        lens = torch.tensor(sizes, dtype=torch.long)
        starts = torch.cumsum(lens, 0) - lens
        seq_of = torch.repeat_interleave(torch.arange(len(sizes)), lens)
        pos = torch.arange(int(lens.sum())) - starts[seq_of]
        dev = torch.cat([pos, seq_of]).to(self.page_table.device)
        flat = _slots(self.page_table, dev[pos.numel():], dev[:pos.numel()], self.page_size)
        return tuple(flat.split(sizes))

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def uniform_width(self) -> int:
        """n when every sequence brings the same n >= 1 new tokens (decode 1, verify D), else 0."""
        n = self.seq_lens[0] if self.seq_lens else 0
        return n if all(m == n for m in self.seq_lens) else 0

    @property
    def is_decode(self) -> bool:
        """Every sequence advances by exactly one token."""
        return all(n == 1 for n in self.seq_lens)

    def token_ranges(self) -> list[tuple[int, int]]:
        """[start, end) of each sequence's new tokens in the flat batch."""
        out, s = [], 0
        for n in self.seq_lens:
            out.append((s, s + n))
            s += n
        return out

    def last_token_rows(self) -> torch.Tensor:
        """Row of each sequence's last new token (where next-token logits are read)."""
        return self.cu_seqlens[1:] - 1


@dataclass(frozen=True)
class StepPlan:
    """One forward of the model: the flat input ids, their ``ForwardPlan``, which rows' logits to
    compute and which layers' outputs to capture (a speculative drafter reads them)."""

    input_ids: torch.Tensor  # [T] int64
    forward: ForwardPlan
    logit_rows: torch.Tensor | None = None  # rows whose logits are read; None: every row
    capture_layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepResult:
    hidden: torch.Tensor  # [T, D] final normalised hidden states of every row
    features: torch.Tensor  # [T, F] captured layer outputs, concatenated (F = 0 without capture)
    logits: torch.Tensor  # [R, V] fp32 logits of ``logit_rows``


def _slots(page_table: torch.Tensor, seq_of: torch.Tensor, positions: torch.Tensor,
           page_size: int) -> torch.Tensor:
    """Token slot of (sequence, position) pairs: page id * page size + offset in the page."""
    return page_table[seq_of, positions // page_size] * page_size + positions % page_size
