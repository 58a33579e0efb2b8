"""A page-granular prefix tree over token ids: which cached KV pages (and KDA state checkpoints)
a new request can reuse.

Each node holds a run of whole pages: ``key`` (its tokens, a multiple of the page size long) and
``pages`` (their page ids); children are keyed by the tokens of their first page. A node may hold
a *checkpoint*: a state slot with the KDA conv + recurrent state after exactly the node's last
token (page boundaries only; the DSA index tail is empty there because page_size % kpool == 0).

References: the tree holds one reference on each of its pages (``RefPool`` counts them); every
request reading a page holds another. A node is evictable when the tree holds the only reference
to its pages; requests read whole prefixes, so an unreferenced node has only unreferenced
descendants, and eviction takes least-recently-used unreferenced leaves first.

Two ways to match (``glmlab.config.RadixMode``):
- ``kv_only``: the deepest page-aligned run of shared tokens (the request brings its own state);
- ``kv_and_state``: only up to the deepest node on that path that holds a checkpoint.

The tree knows nothing about layers, tensors or requests.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from glmlab.cache.pools import RefPool


class _Node:
    __slots__ = ("parent", "children", "key", "pages", "checkpoint", "last_access")

    def __init__(self, parent: _Node | None, key: tuple[int, ...], pages: list[int], tick: int):
        self.parent, self.children = parent, {}
        self.key, self.pages = key, pages
        self.checkpoint: int | None = None
        self.last_access = tick


@dataclass(frozen=True)
class Match:
    length: int  # usable tokens (a multiple of the page size)
    pages: tuple[int, ...]  # their page ids
    checkpoint: int | None  # state slot holding the state after `length` tokens (kv_and_state)
    kv_length: int  # tokens whose KV is cached, whether or not a checkpoint covers them


class RadixTree:
    def __init__(self, page_size: int, pages: RefPool, slots: RefPool):
        self.page_size, self.pool, self.slots = page_size, pages, slots
        self._tick = itertools.count(1)
        self.root = _Node(None, (), [], 0)

    # ------------------------------------------------------------------ lookups
    def match(self, tokens: Sequence[int], need_checkpoint: bool) -> Match:
        """Longest cached prefix of ``tokens`` (whole pages); touches the path for LRU."""
        path = self._walk(tokens, split=True)
        kv_len = sum(len(n.key) for n in path)
        if need_checkpoint:
            while path and path[-1].checkpoint is None:
                path.pop()
        tick = next(self._tick)
        for n in path:
            n.last_access = tick
        pages = tuple(p for n in path for p in n.pages)
        return Match(len(pages) * self.page_size, pages,
                     path[-1].checkpoint if need_checkpoint and path else None, kv_len)

    def _walk(self, tokens: Sequence[int], split: bool) -> list[_Node]:
        s, node, pos, path = self.page_size, self.root, 0, []
        while pos + s <= len(tokens):
            child = node.children.get(tuple(tokens[pos:pos + s]))
            if child is None:
                break
            n = 1
            while n < len(child.pages) and pos + (n + 1) * s <= len(tokens) and \
                    tuple(tokens[pos + n * s:pos + (n + 1) * s]) == child.key[n * s:(n + 1) * s]:
                n += 1
            if n < len(child.pages):
                if not split:
                    break
                child = self._split(child, n)
            path.append(child)
            pos += n * s
            node = child
        return path

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut ``node`` after its first n pages; returns the new upper part."""
        cut = n * self.page_size
        upper = _Node(node.parent, node.key[:cut], node.pages[:n], node.last_access)
        node.parent.children[node.key[: self.page_size]] = upper
        node.key, node.pages, node.parent = node.key[cut:], node.pages[n:], upper
        upper.children[node.key[: self.page_size]] = node
        return upper

    # ------------------------------------------------------------------ updates
    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> list[int]:
        """Make the first len(pages) pages of ``tokens`` cached, adopting ``pages`` where the
        tree has none yet (the tree takes a reference on those). Returns the tree's page ids for
        the whole range: where they differ from ``pages``, the caller holds a duplicate."""
        s = self.page_size
        tokens = tokens[: len(pages) * s]
        path = self._walk(tokens, split=True)
        have = [p for n in path for p in n.pages]
        if len(have) < len(pages):
            parent = path[-1] if path else self.root
            new = list(pages[len(have):])
            leaf = _Node(parent, tuple(tokens[len(have) * s:]), new, next(self._tick))
            parent.children[leaf.key[:s]] = leaf
            self.pool.incref(new)
            path.append(leaf)
            have += new
        tick = next(self._tick)
        for n in path:
            n.last_access = tick
        return have

    def add_checkpoint(self, tokens: Sequence[int], slot: int) -> bool:
        """Attach state ``slot`` to the node ending after ``tokens`` (a cached, page-aligned
        prefix). False if that node already has one or the prefix is not cached: the caller keeps
        (frees) the slot."""
        if not tokens or len(tokens) % self.page_size:
            return False
        path = self._walk(tokens, split=True)
        if sum(len(n.key) for n in path) != len(tokens) or path[-1].checkpoint is not None:
            return False
        path[-1].checkpoint = slot
        return True

    # ------------------------------------------------------------------ eviction
    def _unreferenced(self, node: _Node) -> bool:
        return all(self.pool.refcount(p) == 1 for p in node.pages)

    def evict(self, num_pages: int) -> int:
        """Free at least ``num_pages`` pages from LRU unreferenced leaves if possible; returns
        the pages freed (their checkpoints are freed too)."""
        heap = [(n.last_access, id(n), n) for n in self._nodes()
                if not n.children and self._unreferenced(n)]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_pages:
            _, _, node = heapq.heappop(heap)
            freed += self.pool.decref(node.pages)
            if node.checkpoint is not None:
                self.slots.decref([node.checkpoint])
            parent = node.parent
            del parent.children[node.key[: self.page_size]]
            if parent is not self.root and not parent.children and self._unreferenced(parent):
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def evict_checkpoints(self, num_slots: int) -> int:
        """Drop the ``num_slots`` least recently used checkpoints (their KV stays cached)."""
        held = sorted((n for n in self._nodes() if n.checkpoint is not None),
                      key=lambda n: n.last_access)[:num_slots]
        for n in held:
            self.slots.decref([n.checkpoint])
            n.checkpoint = None
        return len(held)

    # ------------------------------------------------------------------ inspection
    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    @property
    def num_pages(self) -> int:
        return sum(len(n.pages) for n in self._nodes())

    @property
    def num_checkpoints(self) -> int:
        return sum(n.checkpoint is not None for n in self._nodes())

    def evictable_pages(self) -> int:
        return sum(len(n.pages) for n in self._nodes() if self._unreferenced(n))

    def check(self) -> None:
        """Structural invariants: page-aligned keys, consistent links, prefix-closed references."""
        for n in self._nodes():
            if not n.pages or len(n.key) != len(n.pages) * self.page_size:
                raise AssertionError(f"node with {len(n.key)} tokens and {len(n.pages)} pages")
            if n.parent.children.get(n.key[: self.page_size]) is not n:
                raise AssertionError("child is not registered under its first page")
            if any(self.pool.refcount(p) < 1 for p in n.pages):
                raise AssertionError("tree page without the tree's reference")
            if n.parent is not self.root and self._unreferenced(n.parent) and \
                    not self._unreferenced(n):
                raise AssertionError("a referenced node under an unreferenced parent")
