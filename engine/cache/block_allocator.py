"""Reference-counted allocator over the ids of the paged KV pool. Ints only; no tensors.

A block is free when its count is zero. The radix cache holds one reference on every block it
stores; each request holds one reference on every block in its block table.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class OutOfBlocksError(RuntimeError):
    """allocate() was asked for more blocks than are free; callers check num_free first."""


class BlockAllocator:
    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        # FIFO reuse: freshly freed blocks go to the back, which keeps ids predictable in tests.
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfBlocksError(f"asked for {n} blocks, {len(self._free)} free")
        ids = [self._free.popleft() for _ in range(n)]
        for b in ids:
            self._ref[b] = 1
        return ids

    def incref(self, ids: Iterable[int]) -> None:
        for b in ids:
            if self._ref[b] <= 0:
                raise AssertionError(f"incref of free block {b}")
            self._ref[b] += 1

    def decref(self, ids: Iterable[int]) -> None:
        for b in ids:
            if self._ref[b] <= 0:
                raise AssertionError(f"double free of block {b}")
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free.append(b)

    def ref_count(self, block: int) -> int:
        return self._ref[block]
