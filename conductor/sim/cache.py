"""A simulated node's prefix cache: a finite set of blocks in LRU order that publishes the same KV
events as engine.radix_cache, with per-node sequence numbers.

Blocks of one prefix are touched deepest-first, so the root-most block is the most recent and LRU
eviction takes the tails of prefixes before their heads - the leaf-first order of a radix tree.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from raypd.protocol.block_hash import ROOT_HASH
from raypd.protocol.kv_events import BlockRemoved, BlockStored, KVEvent


class BlockLRU:
    def __init__(self, capacity_blocks: int, block_size: int, emit: Callable[[KVEvent], None] | None = None):
        self.capacity = capacity_blocks
        self.block_size = block_size
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._emit = emit
        self.seq = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, h: int) -> bool:
        return h in self._blocks

    def match(self, hashes: Sequence[int], touch: bool = True) -> int:
        """Leading blocks of `hashes` held; refreshed as most recently used when touch."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        if touch:
            for h in reversed(hashes[:n]):
                self._blocks.move_to_end(h)
        return n

    def insert(self, hashes: Sequence[int], token_ids: Callable[[int, int], Sequence[int]]) -> int:
        """Hold every block of `hashes` (a prefix chain), evicting LRU blocks beyond capacity.
        `token_ids(start_block, end_block)` yields the tokens of new blocks for the event.
        Returns how many blocks were new."""
        start = self.match(hashes, touch=False)
        new = list(hashes[start:])
        for h in reversed(hashes[:start]):
            self._blocks.move_to_end(h)
        if new:
            # deepest-first: the new tail is older than the prefix it extends, and its deepest
            # block oldest of all, so eviction never cuts a chain above a block it keeps
            for h in reversed(new):
                self._blocks[h] = None
            for h in reversed(hashes[:start]):
                self._blocks.move_to_end(h)
            if self._emit is not None:
                self.seq += 1
                parent = hashes[start - 1] if start else ROOT_HASH
                self._emit(BlockStored(self.seq, parent, tuple(new), tuple(token_ids(start, len(hashes))),
                                       self.block_size))
        self._evict()
        return len(new)

    def clear(self) -> None:
        """Drop every block (published as removed): the memory went to other work."""
        if self._blocks and self._emit is not None:
            self.seq += 1
            self._emit(BlockRemoved(self.seq, tuple(self._blocks)))
        self._blocks.clear()

    def _evict(self) -> None:
        over = len(self._blocks) - self.capacity
        if over <= 0:
            return
        gone = [self._blocks.popitem(last=False)[0] for _ in range(over)]
        if self._emit is not None:
            self.seq += 1
            self._emit(BlockRemoved(self.seq, tuple(gone)))
