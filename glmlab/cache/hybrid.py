"""HybridCache: the one cache API the scheduler sees (KV pages, recurrent-state slots, radix tree).

A request's cache lease (``SeqCache``) is a state slot and a list of pages covering its positions;
the first ``prefix_len`` tokens may be shared with the radix tree (read-only: a request writes only
positions at or after its own prefix, which always start on a fresh page).

- ``acquire`` admits a request: state slot, prefix match, pages for ``reserve_len`` positions,
  evicting unreferenced tree pages / checkpoints when the free lists run dry; all or nothing.
- ``grow`` adds pages as decoding crosses page boundaries.
- ``commit`` puts a computed page-aligned prefix into the tree (and, in ``kv_and_state`` mode, a
  checkpoint of the request's state there), swapping the request's duplicate pages for the tree's.
- ``release`` ends a lease, leaving its full computed pages in the tree when a tree exists.

Matching: a request that *brings its own state* (imported from a prefill instance, or a test's
reference computation) can reuse any cached KV prefix; one computed here needs the state at the
end of the reused prefix, so it can reuse only up to a checkpoint (``kv_and_state``), and nothing in
``kv_only`` mode. The cache knows nothing about sampling, batches or the model's forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from glmlab.cache.pools import RefPool
from glmlab.cache.radix import Match, RadixTree
from glmlab.cache.storage import ModelCache
from glmlab.core import RadixMode, SeqCache


@dataclass(frozen=True)
class PoolUsage:
    pages_total: int
    pages_free: int
    pages_tree: int  # held by the radix tree (shared or cached for later)
    pages_evictable: int  # tree pages no request reads
    slots_total: int
    slots_free: int
    checkpoints: int  # state slots holding tree checkpoints
    page_size: int

    @property
    def token_slots_used(self) -> int:
        return (self.pages_total - self.pages_free) * self.page_size


@dataclass
class CacheStats:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the tree

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class HybridCache:
    def __init__(self, storage: ModelCache, mode: RadixMode):
        self.storage, self.mode = storage, mode
        self.page_size = storage.page_size
        self.pages = RefPool("KV pages", storage.num_pages)
        self.slots = RefPool("state slots", storage.num_state_slots)
        self.tree = None if mode is RadixMode.OFF else RadixTree(self.page_size, self.pages,
                                                                 self.slots)
        self.stats = CacheStats()

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    # ------------------------------------------------------------------ leases
    def acquire(self, tokens: Sequence[int], reserve_len: int, brings_state: bool,
                samples: int = 1) -> SeqCache | None:
        """Admit a request whose known tokens are ``tokens``; None if the pools cannot hold it.
        ``samples`` > 1 (an imported prompt with n samples): one state slot per sample, the
        pages once."""
        slot = self._alloc(self.slots, samples, self._evict_checkpoints)
        if slot is None:
            return None
        match = self._match(tokens, brings_state)
        self.pages.incref(list(match.pages))  # ours now: eviction below cannot take them
        new = self._alloc(self.pages, self.pages_for(reserve_len) - len(match.pages), self._evict)
        if new is None:
            self.pages.decref(list(match.pages))
            self.slots.decref(slot)
            return None
        slot_t = torch.tensor(slot, device=self.storage.device)
        if match.checkpoint is not None:
            self.storage.copy_state(torch.tensor([match.checkpoint], device=slot_t.device), slot_t)
        elif not brings_state:
            self.storage.reset_state(slot_t)
        self.stats.requests += 1
        self.stats.prompt_tokens += len(tokens)
        self.stats.cached_tokens += match.length
        return SeqCache(slot[0], list(match.pages) + new, match.length, slot[1:])

    def _match(self, tokens: Sequence[int], brings_state: bool) -> Match:
        if self.tree is None or (not brings_state and self.mode is RadixMode.KV_ONLY):
            return Match(0, (), None, 0)
        if brings_state:
            return self.tree.match(tokens, need_checkpoint=False)
        # a computed request must run at least its last token to get logits
        return self.tree.match(tokens[: len(tokens) - 1], need_checkpoint=True)

    def kv_prefix_len(self, tokens: Sequence[int]) -> int:
        """Cached KV tokens of ``tokens`` whether or not a checkpoint covers them (no side
        effects beyond LRU): where a computed request should checkpoint to serve its siblings."""
        return self.tree.match(tokens, need_checkpoint=False).kv_length if self.tree else 0

    def grow(self, seq: SeqCache, num_tokens: int) -> bool:
        """Make ``seq`` cover positions [0, num_tokens); False if no pages could be found."""
        new = self._alloc(self.pages, self.pages_for(num_tokens) - len(seq.pages), self._evict)
        if new is None:
            return False
        seq.pages.extend(new)
        return True

    def commit(self, seq: SeqCache, tokens: Sequence[int], upto: int, checkpoint: bool) -> None:
        """Cache ``tokens[:upto]`` (page-aligned, computed) in the tree; optionally checkpoint the
        request's current state there (valid only when the request has computed exactly
        ``upto`` tokens)."""
        if self.tree is None or upto < self.page_size:
            return
        n = upto // self.page_size
        have = self.tree.insert(tokens[:upto], seq.pages[:n])
        for i, page in enumerate(have):
            if page != seq.pages[i]:  # someone cached these tokens first: read theirs
                self.pages.incref([page])
                self.pages.decref([seq.pages[i]])
                seq.pages[i] = page
        if checkpoint and self.mode is RadixMode.KV_AND_STATE and upto % self.page_size == 0:
            ckpt = self._alloc(self.slots, 1, self._evict_checkpoints)
            if ckpt is None:
                return
            device = self.storage.device
            self.storage.copy_state(torch.tensor([seq.slot], device=device),
                                    torch.tensor(ckpt, device=device))
            if not self.tree.add_checkpoint(tokens[:upto], ckpt[0]):
                self.slots.decref(ckpt)

    def release(self, seq: SeqCache, tokens: Sequence[int], computed_len: int) -> None:
        """End a lease. The first ``computed_len`` tokens of ``tokens`` are in the cache; their
        whole pages stay in the tree (with the state as a checkpoint if it ends on a page)."""
        full = computed_len // self.page_size * self.page_size
        self.commit(seq, tokens, full, checkpoint=False)
        keep_state = (self.tree is not None and self.mode is RadixMode.KV_AND_STATE
                      and full == computed_len > 0
                      and self.tree.add_checkpoint(tokens[:full], seq.slot))
        if not keep_state:
            self.slots.decref([seq.slot])
        self.slots.decref(seq.sample_slots)  # samples that never forked from it
        self.pages.decref(seq.pages)
        seq.pages, seq.sample_slots = [], []

    # ------------------------------------------------------------------ allocation
    @staticmethod
    def _alloc(pool: RefPool, n: int, evict) -> list[int] | None:
        if n <= 0:
            return []
        if pool.num_free < n:
            evict(n - pool.num_free)
        return pool.alloc(n) if pool.num_free >= n else None

    def _evict(self, num_pages: int) -> None:
        if self.tree is not None:
            self.tree.evict(num_pages)

    def _evict_checkpoints(self, num_slots: int) -> None:
        if self.tree is not None:
            self.tree.evict_checkpoints(num_slots)

    def flush(self) -> None:
        """Evict everything the radix tree holds no request reads (all of it when idle)."""
        if self.tree is not None:
            self.tree.evict(self.pages.capacity)
            self.tree.evict_checkpoints(self.slots.capacity)

    def free_or_evictable_pages(self) -> int:
        return self.pages.num_free + (self.tree.evictable_pages() if self.tree else 0)

    # ------------------------------------------------------------------ inspection
    def usage(self) -> PoolUsage:
        tree = self.tree
        return PoolUsage(
            pages_total=self.pages.capacity, pages_free=self.pages.num_free,
            pages_tree=tree.num_pages if tree else 0,
            pages_evictable=tree.evictable_pages() if tree else 0,
            slots_total=self.slots.capacity, slots_free=self.slots.num_free,
            checkpoints=tree.num_checkpoints if tree else 0, page_size=self.page_size)

    def check_idle(self) -> None:
        """With no request holding a lease: every page is free or an evictable tree page, every
        state slot free or a checkpoint, and the free lists are consistent."""
        self.pages.check()
        self.slots.check()
        u = self.usage()
        if self.tree is not None:
            self.tree.check()
        if u.pages_free + u.pages_evictable != u.pages_total or u.pages_tree != u.pages_evictable:
            raise AssertionError(f"pages leaked: {u}")
        if u.slots_free + u.checkpoints != u.slots_total:
            raise AssertionError(f"state slots leaked: {u}")
