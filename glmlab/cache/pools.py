"""Free lists with reference counts: KV pages and recurrent-state slots.

A ``RefPool`` hands out integer ids in ``[reserved, size)``. Id 0 (and any other reserved id) is
never handed out: padded batch rows (CUDA-graph padding) read and write it, so it is scratch that
no request owns; the budget counts it ("+1 padding").

Pages are shared: a prefix page is referenced by the radix tree and by every request reading it,
and returns to the free list when the last reference goes. State slots have one owner each (a
request, or a tree node holding a checkpoint), so they are only ever at refcount 0 or 1. Draft KV
uses the target's page ids and needs no pool of its own.

The pool knows nothing about tokens, layers or requests.
"""

from __future__ import annotations


class PoolExhausted(RuntimeError):
    pass


class RefPool:
    def __init__(self, name: str, size: int, reserved: int = 1):
        if size <= reserved:
            raise ValueError(f"{name} pool of {size} with {reserved} reserved has nothing to give")
        self.name, self.size, self.reserved = name, size, reserved
        self._free = list(range(size - 1, reserved - 1, -1))  # pop() hands out low ids first
        self._refs = [0] * size
        self.num_allocated = 0  # ids handed out since start (a counter: shares are not counted)

    @property
    def capacity(self) -> int:
        return self.size - self.reserved

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.capacity - len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise PoolExhausted(f"{self.name}: asked for {n}, {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        self.num_allocated += n
        for i in out:
            self._refs[i] = 1
        return out

    def incref(self, ids: list[int]) -> None:
        for i in ids:
            if self._refs[i] == 0:
                raise ValueError(f"{self.name}: incref of free id {i}")
            self._refs[i] += 1

    def decref(self, ids: list[int]) -> int:
        """Drop one reference from each id; returns how many became free."""
        freed = 0
        for i in ids:
            if self._refs[i] <= 0:
                raise ValueError(f"{self.name}: decref of free id {i}")
            self._refs[i] -= 1
            if self._refs[i] == 0:
                self._free.append(i)
                freed += 1
        return freed

    def refcount(self, i: int) -> int:
        return self._refs[i]

    def check(self) -> None:
        """Free list and refcounts agree (no id both free and referenced, none lost)."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError(f"{self.name}: an id is on the free list twice")
        for i in range(self.reserved, self.size):
            if (self._refs[i] == 0) != (i in free):
                raise AssertionError(f"{self.name}: id {i} refcount {self._refs[i]} vs free list")
