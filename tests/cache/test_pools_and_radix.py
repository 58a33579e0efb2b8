"""Free lists with refcounts, and the page-granular radix tree: matching, splitting, duplicates,
checkpoints, LRU eviction of unreferenced leaves."""

from __future__ import annotations

import pytest

from glmlab.cache.pools import PoolExhausted, RefPool
from glmlab.cache.radix import RadixTree

S = 4  # page size for tree tests


def test_pool_hands_out_unreserved_ids_and_counts_references():
    pool = RefPool("pages", 6)
    a = pool.alloc(3)
    assert a == [1, 2, 3] and pool.num_free == 2 and 0 not in a
    pool.incref([2])
    assert pool.decref(a) == 2 and pool.refcount(2) == 1
    assert pool.decref([2]) == 1 and pool.num_free == 5
    pool.check()
    with pytest.raises(PoolExhausted):
        pool.alloc(6)
    with pytest.raises(ValueError, match="decref of free"):
        pool.decref([1])
    with pytest.raises(ValueError, match="nothing to give"):
        RefPool("x", 1)


def _tree(num_pages=32, num_slots=8):
    pages, slots = RefPool("pages", num_pages), RefPool("slots", num_slots)
    return RadixTree(S, pages, slots), pages, slots


def _own(pool, tokens):
    return pool.alloc(len(tokens) // S)


def test_match_is_page_granular_and_splits_nodes():
    tree, pages, _ = _tree()
    a = list(range(12))  # three pages
    pa = _own(pages, a)
    assert tree.insert(a, pa) == pa
    pages.decref(pa)  # the request is gone: only the tree holds them
    m = tree.match(a[:8] + [99, 98, 97, 96, 95], need_checkpoint=False)
    assert (m.length, m.pages, m.kv_length) == (8, tuple(pa[:2]), 8)
    assert tree.match(a[:7], need_checkpoint=False).length == 4  # partial page: not usable
    assert tree.match([5, 5, 5, 5], need_checkpoint=False).length == 0
    assert tree.num_pages == 3
    tree.check()


def test_insert_returns_existing_pages_for_duplicates():
    tree, pages, _ = _tree()
    a, b = list(range(8)), list(range(4)) + [50, 51, 52, 53]
    pa, pb = _own(pages, a), _own(pages, b)
    tree.insert(a, pa)
    have = tree.insert(b, pb)
    assert have == [pa[0], pb[1]]  # first page already cached: the tree keeps its own
    assert pages.refcount(pb[1]) == 2 and pages.refcount(pb[0]) == 1  # pb[0] is the duplicate
    tree.check()


def test_checkpoints_limit_the_usable_match():
    tree, pages, slots = _tree()
    a = list(range(16))
    tree.insert(a, _own(pages, a))
    assert tree.match(a, need_checkpoint=True).length == 0
    (s,) = slots.alloc(1)
    assert tree.add_checkpoint(a[:8], s)
    assert not tree.add_checkpoint(a[:8], s)  # already has one
    assert not tree.add_checkpoint(a[:6], s)  # not a page boundary
    m = tree.match(a, need_checkpoint=True)
    assert (m.length, m.checkpoint, m.kv_length) == (8, s, 16)
    assert tree.num_checkpoints == 1
    assert tree.evict_checkpoints(5) == 1 and slots.num_free == slots.capacity


def test_eviction_takes_lru_unreferenced_leaves_only():
    tree, pages, slots = _tree()
    a, b, c = [1] * 4 + [2] * 4, [1] * 4 + [3] * 4, [7] * 8
    for t in (a, b, c):
        p = _own(pages, t)
        tree.insert(t, p)
        pages.decref(p)
    held = tree.match(c, need_checkpoint=False)
    pages.incref(list(held.pages))  # a request reads c
    tree.match(b, need_checkpoint=False)  # b is more recent than a
    assert tree.evictable_pages() == 3  # a's and b's pages (shared first page counted once)
    assert tree.evict(1) == 1  # a's own leaf page goes first (LRU)
    assert tree.match(a, need_checkpoint=False).length == 4
    assert tree.evict(10) == 2  # then b's leaf, then the now-childless shared page
    assert tree.num_pages == 2 and tree.match(c, need_checkpoint=False).length == 8
    pages.decref(list(held.pages))
    assert tree.evict(10) == 2 and tree.num_pages == 0
    pages.check()
    assert pages.num_free == pages.capacity
