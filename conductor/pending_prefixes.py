"""Prefixes a prefill node is about to hold: routed to it, not yet reported by its KV events.

A node reports a prompt's blocks only once it has computed them, which on a long prompt takes
seconds. Without this, every request that shares a new prefix and arrives in those seconds sees
no holder, and each recomputes the whole prefix on some node (the cold-burst tail the simulator
showed). Like SGLang's router, which inserts a prompt into its tree at routing time, the Conductor
counts a routed prompt's blocks as held by its prefill node until they show up in the index or the
entry expires (an aborted or failed request must not attract traffic forever).

    _counts: (block hash, slot) -> number of routed requests expecting the block there
    _mask:   block hash -> bitmask of the slots expecting it (matched like the index: one AND per block)

Only every STRIDE-th block of a chain (and its last) is recorded and looked at: hashes are chained
and node caches prefix-closed, so holding block i means holding blocks 0..i, and a match found to
STRIDE-block precision costs STRIDE times less per routed request (a decision at 1000 nodes has
well under a millisecond to spend).
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from raypd.conductor.prefix_index import bits

STRIDE = 8


def _positions(n: int, start: int = 0) -> list[int]:
    """The chain positions recorded and matched: every STRIDE-th block and the last one."""
    out = list(range(STRIDE - 1, n, STRIDE))
    if n and (not out or out[-1] != n - 1):
        out.append(n - 1)
    return [p for p in out if p >= start]


class PendingPrefixes:
    def __init__(self) -> None:
        self._counts: dict[tuple[int, int], int] = {}
        self._mask: dict[int, int] = {}
        self._expiry: list[tuple[float, int, int, tuple[int, ...]]] = []  # (until, seq, slot, chain)
        self._seq = 0

    def add(self, slot: int, chain: Sequence[int], until: float, start: int = 0) -> None:
        """The node in `slot` will hold the leading blocks `chain` (hashes) until about `until`; it
        holds chain[:start] already (the index says so), so only later blocks are recorded."""
        keys = tuple(chain[p] for p in _positions(len(chain), start))
        if not keys:
            return
        bit = 1 << slot
        counts, mask = self._counts, self._mask
        for h in keys:
            key = (h, slot)
            n = counts.get(key, 0)
            counts[key] = n + 1
            if not n:
                mask[h] = mask.get(h, 0) | bit
        self._seq += 1
        heapq.heappush(self._expiry, (until, self._seq, slot, keys))

    def expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            _, _, slot, chain = heapq.heappop(self._expiry)
            self._drop(slot, chain)

    def remove_slot(self, slot: int) -> None:
        """A node died or left: nothing is pending on it any more."""
        kept = []
        for entry in self._expiry:
            if entry[2] == slot:
                self._drop(slot, entry[3])
            else:
                kept.append(entry)
        heapq.heapify(kept)
        self._expiry = kept

    def tokens_by_slot(self, chain: Sequence[int], block_size: int, num_slots: int,
                       held: dict[int, int] | None = None) -> np.ndarray:
        """Per slot, the prompt tokens in the leading run of `chain` that is pending there or, with
        `held` (the index's block hash -> holder bitmask), held there already: a node that holds a
        prefix and was sent its continuation matches the whole run. STRIDE-block precision."""
        out = np.zeros(max(num_slots, 1), dtype=np.int64)
        get = self._mask.get
        hget = held.get if held is not None else None
        cur, prev = -1, 0
        for p in _positions(len(chain)):
            h = chain[p]
            m = get(h, 0)
            if hget is not None:
                m |= hget(h, 0)
            nxt = cur & m
            if nxt != cur:
                if prev:
                    for slot in bits(cur & ~nxt):
                        out[slot] = prev * block_size
                cur = nxt
                if not cur:
                    return out
            prev = p + 1
        if cur > 0:
            for slot in bits(cur):
                out[slot] = prev * block_size
        return out

    def __len__(self) -> int:
        return len(self._expiry)

    def _drop(self, slot: int, chain: tuple[int, ...]) -> None:
        bit = 1 << slot
        counts, mask = self._counts, self._mask
        for h in chain:
            key = (h, slot)
            n = counts.get(key, 0)
            if n > 1:
                counts[key] = n - 1
            elif n == 1:
                del counts[key]
                m = mask.get(h, 0) & ~bit
                if m:
                    mask[h] = m
                else:
                    mask.pop(h, None)
