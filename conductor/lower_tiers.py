"""What nodes keep below their KV pools (host memory, disk: protocol/kv_events.KVTier): the blocks a
node can load back into its pool instead of computing them. The prefix index (prefix_index.py)
owns one and extends each node's pool run with it.

    masks: block hash -> int bitmask, bit s set when slot s holds the block in some tier below its pool
    _sets: slot -> lower tier -> set of block hashes (to drop a node at once, and to tell which tier
           holds a block)

Tiers are independent: a block can sit in several at once (a block loaded back from disk stays on
disk), so a slot's bit in `masks` goes only when no lower tier of that slot holds the block.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from raypd.protocol.kv_events import KVTier

NUM_TIERS = len(KVTier)
LOWER_TIERS = tuple(t for t in KVTier if t is not KVTier.POOL)


class LowerTiers:
    def __init__(self) -> None:
        self.masks: dict[int, int] = {}
        self._sets: dict[int, dict[KVTier, set[int]]] = {}

    def add_slot(self, slot: int) -> None:
        self._sets[slot] = {t: set() for t in LOWER_TIERS}

    def drop_slot(self, slot: int) -> None:
        self.clear(slot)
        del self._sets[slot]

    def store(self, slot: int, tier: KVTier, hashes: Iterable[int]) -> None:
        bit, mine, masks = 1 << slot, self._sets[slot][tier], self.masks
        for h in hashes:
            if h not in mine:
                mine.add(h)
                masks[h] = masks.get(h, 0) | bit

    def remove(self, slot: int, tier: KVTier, hashes: Iterable[int]) -> None:
        bit, sets = 1 << slot, self._sets[slot]
        mine = sets[tier]
        for h in hashes:
            if h in mine:
                mine.discard(h)
                if not any(h in s for s in sets.values()):
                    unset(self.masks, h, bit)

    def clear(self, slot: int) -> None:
        """Every lower tier of the slot (a re-sync, a node gone)."""
        bit, sets = 1 << slot, self._sets[slot]
        for h in set().union(*sets.values()):
            unset(self.masks, h, bit)
        for s in sets.values():
            s.clear()

    def split(self, slot: int, chain: list[int], start: int, end: int, pool: set[int]) -> np.ndarray:
        """(NUM_TIERS,) blocks of chain[start:end] by the fastest tier of `slot` holding each, `pool`
        being the slot's pool blocks (every block must be in one of them)."""
        counts = np.zeros(NUM_TIERS, dtype=np.int64)
        sets = self._sets[slot]
        for h in chain[start:end]:
            if h in pool:
                counts[KVTier.POOL] += 1
                continue
            for t in LOWER_TIERS:
                if h in sets[t]:
                    counts[t] += 1
                    break
        return counts

    def blocks(self, slot: int, tier: KVTier) -> int:
        return len(self._sets[slot][tier])

    @property
    def num_entries(self) -> int:
        """(node, block, tier) triples."""
        return sum(len(s) for sets in self._sets.values() for s in sets.values())

    def __bool__(self) -> bool:
        return bool(self.masks)


def unset(masks: dict[int, int], h: int, bit: int) -> None:
    """Clear `bit` in masks[h], dropping the entry once no bit is left."""
    m = masks[h] & ~bit
    if m:
        masks[h] = m
    else:
        del masks[h]
