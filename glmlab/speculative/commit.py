"""What a verify forward records of the carried state, and the commit to an accepted prefix.

A verify forward advances every request's carried state over its whole window: the KDA recurrent
and conv state, and each DSA layer's indexer tail (the raw rows of the incomplete 4-token pool).
After ``commit_len`` window tokens are accepted the cache must hold exactly the state after
``commit_len`` steps. ``SpecStateStore`` is the ``VerifyRecorder`` a verify plan carries
(``glmlab.model.plan``); per state slot it keeps

- the conv window ``[W-1+D, C]``: the held W-1 conv inputs, then the window's D inputs; the state
  after c steps is rows c .. c+W-2 (sglang keeps a per-step copy, ``intermediate_conv_window``).
  Time-major, so the window's inputs (token rows of the projection) land in one contiguous copy
  and only the W-1 held columns are transposed;
- the indexer rows ``[kpool-1+D, 2*DI]`` per DSA layer: the held tail rows, then the window's rows;
  the tail after c steps is the rows of the pool that is incomplete at the committed length;
- the KDA recurrence in ``REPLAY`` (ring of step inputs) or ``SNAPSHOT`` (post-step states) mode.

The MTP drafter's draft-extend after a verify runs over the same uniform window (every request's
D positions, ``glmlab.speculative.mtp``) with this store as its recorder: the MTP layer (a DSA
layer, index ``cfg.mtp_layer``) records its indexer rows like the target's DSA layers, and
``commit_index_tails`` rolls that layer's tail once the extend has run. So the store keeps index
rows for the MTP layer too whenever the config has one (``index_layers``).

Rows the window wrote past the accepted length (MLA latents, pooled indexer keys of pools that
completed inside the rejected part) need no undo: a pool key or latent row is rewritten by the
step that really reaches its position, before any query can read it.

Buffers are indexed by *rows* of their own (``num_rows``), not by state slot: only requests that
speculate need one, and a budget may give the store fewer rows than there are state slots.
``bind`` maps a state slot to a row; by default row i serves state slot i.

``commit`` leaves the committed KDA state untouched when the verify did (both modes), so a request
whose cycle is abandoned (abort, finish) leaves no trace: its row is simply unbound.
"""

from __future__ import annotations

import torch

from glmlab.cache.storage import ModelCache
from glmlab.config import ModelConfig
from glmlab.speculative.replay import (
    CommitMode,
    ReplayRing,
    StateSnapshots,
    check_commit_impl,
    put_rows,
)


class SpecStateStore:
    def __init__(self, cfg: ModelConfig, num_rows: int, width: int, mode: CommitMode,
                 act_dtype: torch.dtype, state_dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", num_state_slots: int | None = None,
                 commit_impl: str = "torch"):
        """``commit_impl``: how REPLAY mode replays the accepted KDA steps, "torch" or "triton"
        (``ReplayRing``); in REPLAY mode "triton" also drops the commit's host-side checks."""
        if width < 2:
            raise ValueError(f"a verify window holds the anchor and >= 1 draft; got width {width}")
        self.cfg, self.width, self.mode = cfg, width, CommitMode(mode)
        self.commit_impl = check_commit_impl(commit_impl)
        self.kernel_commit = commit_impl == "triton" and self.mode is CommitMode.REPLAY
        kd, ds = cfg.kda, cfg.dsa
        self.row_of_slot = torch.full((num_state_slots or num_rows,), -1, dtype=torch.long,
                                      device=device)
        if num_state_slots is None:
            self.row_of_slot[:] = torch.arange(num_rows, device=device)
        self.conv_window = {i: torch.zeros(num_rows, kd.conv_kernel - 1 + width, kd.conv_channels,
                                           dtype=act_dtype, device=device) for i in cfg.kda_layers}
        self.index_rows = {i: torch.zeros(num_rows, ds.index_kpool - 1 + width,
                                          2 * ds.index_head_dim, dtype=act_dtype, device=device)
                           for i in index_layers(cfg)}
        self.index_held = torch.zeros(num_rows, dtype=torch.long, device=device)
        if self.mode is CommitMode.REPLAY:
            self.recurrence = ReplayRing(cfg, num_rows, width, act_dtype, device, commit_impl)
        else:
            self.recurrence = StateSnapshots(cfg, num_rows, width, state_dtype, device)

    def bind(self, slots: list[int], rows: list[int]) -> None:
        self.row_of_slot[slots] = torch.tensor(rows, dtype=torch.long,
                                               device=self.row_of_slot.device)

    def unbind(self, slots: list[int]) -> None:
        self.row_of_slot[slots] = -1

    def rows(self, slots: torch.Tensor) -> torch.Tensor:
        return self.row_of_slot[slots.to(self.row_of_slot.device)]

    # --- VerifyRecorder (called by the KDA and DSA layers during a verify forward) ----------
    def _window(self, n_tokens: int, n_seqs: int) -> int:
        d = n_tokens // n_seqs
        if d * n_seqs != n_tokens or not 1 <= d <= self.width:
            raise ValueError(f"verify batch of {n_tokens} tokens over {n_seqs} sequences does not "
                             f"split into equal windows of at most {self.width}")
        return d

    def record_conv(self, layer: int, slots: torch.Tensor, held: torch.Tensor,
                    x: torch.Tensor) -> None:
        n = slots.shape[0]
        d = self._window(x.shape[0], n)
        store = self.conv_window[layer]
        window = torch.cat([held.transpose(1, 2).to(store.dtype),
                            x.view(n, d, -1).to(store.dtype)], dim=1)  # [N, W-1+d, C]
        put_rows(store, self.rows(slots), window)

    def kda_recurrence(self, layer: int, slots: torch.Tensor, q, k, v, g, beta,
                       states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = slots.shape[0]
        d = self._window(k.shape[0], n)
        q, k, v, g = (t.view(n, d, *t.shape[1:]) for t in (q, k, v, g))
        o = self.recurrence.verify(layer, self.rows(slots), q, k, v, g, beta.view(n, d, -1),
                                   states)
        return o.flatten(0, 1), states  # the committed state is not advanced

    def record_kda_steps(self, layer: int, slots: torch.Tensor, k, v, g, beta) -> bool:
        """REPLAY mode: record the window's recurrence inputs (k, g, v [T, H, *], beta [T, H])
        and return True, so the caller computes the outputs without advancing the state (a fused
        kernel does). SNAPSHOT mode returns False: it needs the post-step states of
        ``kda_recurrence``."""
        if self.mode is not CommitMode.REPLAY:
            return False
        n = slots.shape[0]
        d = self._window(k.shape[0], n)
        self.recurrence.record(layer, self.rows(slots), *(t.view(n, d, *t.shape[1:])
                                                          for t in (k, v, g, beta)))
        return True

    def record_index_rows_batched(self, layer: int, slots: torch.Tensor, held: torch.Tensor,
                                  rows: torch.Tensor) -> None:
        """``record_index_rows`` for N requests at once, without host lengths: rows
        [N, kpool-1+D, 2*DI] (each request's held rows first), held [N] on the device."""
        r = self.rows(slots)
        put_rows(self.index_rows[layer], r, rows.to(self.index_rows[layer].dtype))
        self.index_held.index_copy_(0, r, held.to(self.index_held.dtype))

    def record_index_rows(self, layer: int, slot: torch.Tensor, held: int,
                          rows: torch.Tensor) -> None:
        row = self.rows(slot)
        self.index_rows[layer][row, : rows.shape[0]] = rows.to(self.index_rows[layer].dtype)
        self.index_held[row] = held

    # --- commit ------------------------------------------------------------------------------
    def commit(self, cache: ModelCache, slots: torch.Tensor, commit_lens: torch.Tensor) -> None:
        """Roll every carried state of ``slots`` to the first ``commit_lens`` window steps."""
        slots = slots.to(self.index_held.device)
        rows = self.rows(slots)
        lens = commit_lens.to(slots.device).long()
        # Each check reads a device value on the host: a sync that stalls the GPU stream once per
        # commit and keeps the commit out of a CUDA graph. The torch paths sync anyway
        # (``replay_steps`` reads the longest length), so they keep them. The kernel path skips
        # them: the kernel clamps lengths to 0..D and leaves a row of -1 untouched, so neither
        # can make it touch memory outside the ring or the state; a length of 0 also leaves the
        # conv and index state as they were. What stays the callers' duty there: binding every
        # slot they commit (an unbound slot's conv and index rows would be read from row -1).
        if not self.kernel_commit:
            if bool(((lens < 1) | (lens > self.width)).any()):
                raise ValueError(f"commit lengths must lie in 1..{self.width}: {lens.tolist()}")
            if bool((rows < 0).any()):
                raise ValueError(f"state slots without a speculative row: "
                                 f"{slots[rows < 0].tolist()}")
        w1 = self.cfg.kda.conv_kernel - 1
        steps = lens[:, None] + torch.arange(w1, device=slots.device)  # [N, W-1]
        for layer in self.cfg.kda_layers:
            window = self.conv_window[layer][rows]  # [N, W-1+D, C]
            idx = steps[:, :, None].expand(-1, -1, window.shape[2])
            held = window.gather(1, idx).transpose(1, 2)  # [N, C, W-1]
            cache.conv[layer][slots] = held.to(cache.conv[layer].dtype)
            self.recurrence.commit(layer, cache.recurrent[layer], slots, rows, lens)
        self._roll_index_tails(cache, slots, rows, lens, self.cfg.dsa_layers)

    def commit_index_tails(self, cache: ModelCache, slots: torch.Tensor,
                           commit_lens: torch.Tensor, layers: tuple[int, ...]) -> None:
        """Roll only the indexer tails of ``layers`` to the first ``commit_lens`` window steps:
        the MTP draft-extend's commit, after it recorded its layer over the verify's window.
        No checks (no host sync): the lengths are the ones ``commit`` has just accepted."""
        slots = slots.to(self.index_held.device)
        self._roll_index_tails(cache, slots, self.rows(slots),
                               commit_lens.to(slots.device).long(), layers)

    def _roll_index_tails(self, cache: ModelCache, slots: torch.Tensor, rows: torch.Tensor,
                          lens: torch.Tensor, layers: tuple[int, ...]) -> None:
        kp = self.cfg.dsa.index_kpool
        end = self.index_held[rows] + lens  # position just past the committed length
        new_held = end % kp
        picks = (end - new_held)[:, None] + torch.arange(kp, device=slots.device)  # [N, kpool]
        picks = picks.clamp(max=kp - 2 + self.width)  # entries past the tail are masked below
        for layer in layers:
            src = self.index_rows[layer][rows]  # [N, kpool-1+D, 2*DI]
            tail = src.gather(1, picks[..., None].expand(-1, -1, src.shape[2]))
            keep = torch.arange(kp, device=slots.device)[None, :] < new_held[:, None]
            old = cache.index_tail[layer][slots]
            cache.index_tail[layer][slots] = torch.where(keep[..., None], tail.to(old.dtype), old)

    @staticmethod
    def bytes_per_slot(cfg: ModelConfig, width: int, mode: CommitMode, act_dtype: torch.dtype,
                       state_dtype: torch.dtype) -> dict[str, int]:
        """Speculative-state bytes one state slot needs, by part."""
        act = torch.finfo(act_dtype).bits // 8
        kd, ds = cfg.kda, cfg.dsa
        conv = len(cfg.kda_layers) * kd.conv_channels * (kd.conv_kernel - 1 + width) * act
        rows = (ds.index_kpool - 1 + width) * 2 * ds.index_head_dim * act  # one layer's, per slot
        index = len(index_layers(cfg)) * rows
        if CommitMode(mode) is CommitMode.REPLAY:
            rec = ReplayRing.bytes_per_slot(cfg, width, act_dtype)
        else:
            rec = StateSnapshots.bytes_per_slot(cfg, width, state_dtype)
        return {"recurrence": rec, "conv_window": conv, "index_rows": index,
                "total": rec + conv + index}


def index_layers(cfg: ModelConfig) -> tuple[int, ...]:
    """The DSA layers whose indexer rows a store keeps: the target's, and the MTP layer's (its
    draft-extend is a uniform window too). A DFlash2 run on a config with an MTP layer carries its
    unused rows: one layer's kpool-1+D rows per store row, a few KiB."""
    return (*cfg.dsa_layers, *(() if cfg.mtp_layer is None else (cfg.mtp_layer,)))
