"""Which rows of which cache tensors one prefilled request sends to decode.

The cache (``glmlab.cache.storage.ModelCache``) holds, per DSA layer, rows addressed by token slot
(``latent``), by indexer pool (``pool_keys``, one row per ``kpool`` tokens) and by state slot
(``index_tail``), and per KDA layer rows by state slot (``conv``, ``recurrent``). A request lives in
pages of ``page_size`` token slots and one state slot. Decode already holds the first
``decode_prefix_len`` tokens (page aligned, from its kv_only radix match) and gives the pages for
the rest; so prefill sends, for pages ``decode_prefix_len // page_size`` onwards, every token-row
and pool-row of those pages, then the request's state rows, then one aux row (the first token).

Every per-layer tensor dict of the cache must be classified here: a new pool (draft KV) that this
table does not know stops the service at start-up instead of being silently left behind.
"""

from __future__ import annotations

from enum import Enum

import torch

from glmlab.serve.bootstrap import RoomMessage
from glmlab.serve.transfer import RowCopy, TransferError


class Unit(str, Enum):
    TOKEN = "token"  # one row per token slot
    POOL = "pool"  # one row per kpool token slots
    STATE = "state"  # one row per state slot


# cache attribute -> what one row of its tensors is
CACHE_TENSORS = {"latent": Unit.TOKEN, "pool_keys": Unit.POOL, "index_tail": Unit.STATE,
                 "conv": Unit.STATE, "recurrent": Unit.STATE, "draft_kv": Unit.TOKEN}
AUX = "aux"
AUX_WIDTH = 4  # first token id, its logprob, cached tokens on prefill, prompt length


def cache_tensors(cache) -> dict[str, tuple[torch.Tensor, Unit]]:
    """Every transferable tensor of ``cache`` as ``{"latent.3": (tensor, Unit.TOKEN), ...}``."""
    out = {}
    for attr, value in vars(cache).items():
        if not (isinstance(value, dict) and value
                and all(isinstance(t, torch.Tensor) for t in value.values())):
            continue
        if attr not in CACHE_TENSORS:
            raise TransferError(f"cache attribute {attr!r} holds per-layer tensors that the PD "
                                f"transfer does not know how to send (add it to CACHE_TENSORS)")
        for layer, t in value.items():
            out[f"{attr}.{layer}"] = (t, CACHE_TENSORS[attr])
    return out


def new_aux(num_state_slots: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """One row per state slot, on the cache's device (one WRITE moves host or GPU memory)."""
    return torch.zeros(num_state_slots, AUX_WIDTH, dtype=torch.float64, device=device)


def row_copies(tensors: dict[str, tuple[torch.Tensor, Unit]], page_size: int, kpool: int,
               src_pages: list[int], src_state_slot: int, src_aux_row: int,
               msg: RoomMessage) -> list[RowCopy]:
    """The rows to WRITE for ``msg``; ``src_pages`` are prefill's pages of the whole prompt."""
    first = msg.decode_prefix_len // page_size
    if msg.decode_prefix_len % page_size:
        raise TransferError(f"decode_prefix_len {msg.decode_prefix_len} is not page aligned")
    num_pages = -(-msg.prompt_len // page_size)
    send = src_pages[first:num_pages]
    if len(send) != len(msg.dst_pages):
        raise TransferError(f"room {msg.room}: decode gave {len(msg.dst_pages)} pages for "
                            f"{len(send)} pages of prompt after its {msg.decode_prefix_len} "
                            f"cached tokens")
    copies = []
    for name, (_, unit) in tensors.items():
        if unit is Unit.STATE:
            copies.append(RowCopy(name, src_state_slot, msg.dst_state_slot))
            continue
        rows = page_size if unit is Unit.TOKEN else page_size // kpool
        copies += [RowCopy(name, s * rows, d * rows, rows)
                   for s, d in zip(send, msg.dst_pages, strict=True)]
    copies.append(RowCopy(AUX, src_aux_row, msg.dst_aux_row))
    return copies
