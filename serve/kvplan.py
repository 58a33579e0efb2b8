"""Which rows of which cache regions one prefilled request sends to decode.

The regions are the cache's own list (``ModelCache.regions()``): every storage tensor by name with
the unit its rows are addressed by, ``token`` (token slot), ``pool`` (token slot // kpool, e.g.
pooled indexer keys and, with FP8 keys, their per-pool scales) or ``state`` (state slot). A
request lives in pages of ``page_size`` token slots and one state slot. Decode already holds the
first ``decode_prefix_len`` tokens (page aligned, from its kv_only radix match) and gives the
pages for the rest; so prefill sends, for pages ``decode_prefix_len // page_size`` onwards, every
token row and pool row of those pages, then the request's state rows, then one aux row (the
first token; under TP only rank 0 sends it, the rank that reads it). The regions include the
drafter's hand-off rows when speculation is on (``glmlab.speculative.handoff``: token rows of
DFlash2 draft KV, state rows of the MTP chain start). A region of a unit this table does not know
stops the service at start-up instead of being silently left behind.

This module knows row arithmetic only: not the engine, not NIXL.
"""

from __future__ import annotations

import torch

from glmlab.serve.bootstrap import RoomMessage
from glmlab.serve.transfer import RowCopy, TransferError

UNITS = ("token", "pool", "state")
AUX = "aux"
AUX_WIDTH = 4  # first token id, its logprob, cached tokens on prefill, prompt length

Regions = dict[str, tuple[torch.Tensor, str]]  # name -> (tensor, unit), as ModelCache.regions()


def checked_regions(regions: Regions) -> Regions:
    """``regions`` after checking every unit is one this module can send."""
    for name, (_, unit) in regions.items():
        if unit not in UNITS:
            raise TransferError(f"cache region {name!r} is addressed by {unit!r} rows, which the "
                                f"PD transfer does not know how to send (units: {UNITS})")
    if AUX in regions:
        raise TransferError(f"a cache region is named {AUX!r}, the transfer's own aux row")
    return regions


def new_aux(num_state_slots: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """One row per state slot, on the cache's device (one WRITE moves host or GPU memory)."""
    return torch.zeros(num_state_slots, AUX_WIDTH, dtype=torch.float64, device=device)


def row_copies(regions: Regions, page_size: int, kpool: int, src_pages: list[int],
               src_state_slot: int, src_aux_row: int, msg: RoomMessage,
               aux: bool = True) -> list[RowCopy]:
    """The rows to WRITE for ``msg``; ``src_pages`` are prefill's pages of the whole prompt;
    ``aux``: the aux row too (rank 0 of a TP worker)."""
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
    for name, (_, unit) in regions.items():
        if unit == "state":
            copies.append(RowCopy(name, src_state_slot, msg.dst_state_slot))
            continue
        rows = page_size if unit == "token" else page_size // kpool
        copies += [RowCopy(name, s * rows, d * rows, rows)
                   for s, d in zip(send, msg.dst_pages, strict=True)]
    if aux:
        copies.append(RowCopy(AUX, src_aux_row, msg.dst_aux_row))
    return copies
