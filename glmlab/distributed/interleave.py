"""Interleaved token shards and the two collectives that move them.

Under interleaved context parallelism token j of a T-token step belongs to rank j % cp, at local
row j // cp (rank r owns r, r+cp, r+2cp, ...). Interleaving balances causal attention work:
every rank gets early and late positions alike. Every rank holds ``padded_len`` = ceil(T/cp) local
rows so that all collectives see equal shapes; a rank with fewer tokens carries zero rows at the
end, which attention ignores and the gathers drop.

Gathered tensors come out *rank-major* ([cp * padded_len, ...], rank 0's rows first), which is all
a per-token op (routing, experts) needs; ``to_sequence`` reorders them when order matters
(attention, the KDA recurrence), and ``to_rank_major`` is its inverse for the reduce-scatter back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

# torch 2.13 renamed the tensor collectives; the H200 machines run torch 2.11 (old names only).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class Interleave:
    num_tokens: int  # T of the whole step
    size: int  # cp
    rank: int

    @property
    def padded_len(self) -> int:
        return -(-self.num_tokens // self.size)

    @property
    def local_len(self) -> int:
        return len(range(self.rank, self.num_tokens, self.size))

    def local_rows(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Positions in the step's flat batch of this rank's tokens, ascending."""
        return torch.arange(self.rank, self.num_tokens, self.size, device=device)

    def shard(self, full: torch.Tensor) -> torch.Tensor:
        """[T, ...] in sequence order -> this rank's rows, zero padded to [padded_len, ...]."""
        mine = full[self.rank:: self.size]
        return _pad_rows(mine, self.padded_len)

    def to_sequence(self, gathered: torch.Tensor) -> torch.Tensor:
        """Rank-major [cp * padded_len, ...] -> [T, ...] in sequence order."""
        rest = gathered.shape[1:]
        grid = gathered.view(self.size, self.padded_len, *rest).transpose(0, 1)
        return grid.reshape(self.size * self.padded_len, *rest)[: self.num_tokens]

    def to_rank_major(self, full: torch.Tensor) -> torch.Tensor:
        """[T, ...] in sequence order -> rank-major [cp * padded_len, ...] (zero rows for pads)."""
        padded = _pad_rows(full, self.size * self.padded_len)
        rest = full.shape[1:]
        grid = padded.view(self.padded_len, self.size, *rest).transpose(0, 1)
        return grid.reshape(self.size * self.padded_len, *rest)


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])])


class CPComm:
    """The CP group's all-gather and reduce-scatter, with a running count of bytes moved."""

    def __init__(self, group, size: int, rank: int):
        self.group, self.size, self.rank = group, size, rank
        self.gathered_bytes = 0  # bytes received from all ranks by all-gathers, own rows included
        self.scattered_bytes = 0  # bytes sent into reduce-scatters

    def interleave(self, num_tokens: int) -> Interleave:
        if num_tokens < self.size:
            raise ValueError(f"a CP step needs at least one token per rank: {num_tokens} tokens "
                             f"for {self.size} ranks")
        return Interleave(num_tokens, self.size, self.rank)

    def all_gather(self, local: torch.Tensor) -> torch.Tensor:
        """[padded_len, ...] on every rank -> rank-major [cp * padded_len, ...]."""
        out = local if self.size == 1 else local.new_empty(self.size * local.shape[0],
                                                           *local.shape[1:])
        if self.size > 1:
            _all_gather(out, local.contiguous(), group=self.group)
        self.gathered_bytes += out.numel() * out.element_size()
        return out

    def reduce_scatter(self, rank_major: torch.Tensor) -> torch.Tensor:
        """Rank-major partial sums [cp * padded_len, ...] -> this rank's summed rows."""
        self.scattered_bytes += rank_major.numel() * rank_major.element_size()
        if self.size == 1:
            return rank_major
        out = rank_major.new_empty(rank_major.shape[0] // self.size, *rank_major.shape[1:])
        _reduce_scatter(out, rank_major.contiguous(), group=self.group)
        return out
