"""Which rows of which cache regions one prefilled request sends to decode.

The regions are the cache's own list (``ModelCache.regions()``): every storage tensor by name with
the unit its rows are addressed by, ``token`` (token slot), ``pool`` (token slot // kpool, e.g.
pooled indexer keys and, with FP8 keys, their per-pool scales) or ``state`` (state slot). A
request lives in pages of ``page_size`` token slots and one state slot. Decode already holds the
first ``decode_prefix_len`` tokens (page aligned, from its kv_only radix match) and gives the
pages for the rest; so prefill sends, for pages ``decode_prefix_len // page_size`` onwards, every
token row and pool row of those pages, then the request's state rows, then one aux row per
sample (its first token, logprob and top alternatives; a prompt with n samples moves its pages
and state once; under TP only rank 0 sends them, the rank that reads them). The regions include the
drafter's hand-off rows when speculation is on (``glmlab.speculative.handoff``: token rows of
DFlash2 draft KV, state rows of the MTP chain start). A region of a unit this table does not know
stops the service at start-up instead of being silently left behind.

This module knows row arithmetic only: not the engine, not NIXL.
"""

from __future__ import annotations

import torch

from glmlab.core import MAX_TOP_LOGPROBS, TokenLogprob
from glmlab.serve.bootstrap import RoomMessage
from glmlab.serve.transfer import RowCopy, TransferError

UNITS = ("token", "pool", "state")
AUX = "aux"
# first token id, its logprob (NaN: not asked), cached tokens on prefill, prompt length, how many
# alternatives follow, then (token id, logprob) of each (SGLang's metadata buffers carry the same)
AUX_HEAD = 5
AUX_WIDTH = AUX_HEAD + 2 * MAX_TOP_LOGPROBS

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


def new_aux(num_rows: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``num_rows`` aux rows on the cache's device (one WRITE moves host or GPU memory)."""
    return torch.zeros(num_rows, AUX_WIDTH, dtype=torch.float64, device=device)


def aux_row(token: int, lp: TokenLogprob | None, cached: int, prompt_len: int) -> list[float]:
    """One sample's aux row: its first token and what decode reports about it."""
    top = lp.top[:MAX_TOP_LOGPROBS] if lp is not None else ()
    row = [token, lp.logprob if lp is not None else float("nan"), cached, prompt_len, len(top)]
    row += [x for pair in top for x in pair]
    return row + [0.0] * (AUX_WIDTH - len(row))


def read_aux_row(row: list[float]) -> tuple[int, TokenLogprob | None, int, int]:
    """(first token, its logprob with its alternatives or None, prefill's cached tokens, prompt
    length) of an aux row written by ``aux_row``."""
    token, lp, cached, prompt_len, k = row[:AUX_HEAD]
    pairs = row[AUX_HEAD:AUX_HEAD + 2 * int(k)]
    top = tuple((int(pairs[i]), pairs[i + 1]) for i in range(0, len(pairs), 2))
    logprob = None if lp != lp else TokenLogprob(int(token), lp, top)  # NaN: not asked
    return int(token), logprob, int(cached), int(prompt_len)


def row_copies(regions: Regions, page_size: int, kpool: int, src_pages: list[int],
               src_state_slot: int, src_aux_rows: list[int], msg: RoomMessage,
               aux: bool = True) -> list[RowCopy]:
    """The rows to WRITE for ``msg``; ``src_pages`` are prefill's pages of the whole prompt,
    ``src_aux_rows`` the aux rows of its samples; ``aux``: the aux rows too (rank 0 of a TP
    worker)."""
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
        if len(src_aux_rows) != len(msg.dst_aux_rows):
            raise TransferError(f"room {msg.room}: decode gave {len(msg.dst_aux_rows)} aux rows "
                                f"for {len(src_aux_rows)} samples")
        copies += [RowCopy(AUX, s, d) for s, d in zip(src_aux_rows, msg.dst_aux_rows,
                                                      strict=True)]
    return copies
