"""Decayed hit-frequency scores of matched prefixes: which prefixes are hot right now.

A prefix is named by the hash of its last block (chained hashes make that name cover the whole
prefix). Each routed request that matched a cached prefix adds one hit to it; scores decay with a
half-life, so score ~ hit rate x half_life / ln 2 under a steady rate. Decay is applied lazily on
read or hit. The table is bounded: past max_tracked entries the colder half is dropped.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class HotPrefix:
    key: int                    # hash of the prefix's last block
    block_size: int
    num_tokens: int
    token_ids: tuple[int, ...] = field(repr=False)  # so a holder can export exactly this prefix
    score: float = 0.0
    updated: float = 0.0
    hits: int = 0


class HotPrefixTracker:
    def __init__(self, half_life_s: float, max_tracked: int = 4096):
        self.half_life_s = half_life_s
        self.max_tracked = max_tracked
        self._lambda = math.log(2) / half_life_s
        self._entries: dict[int, HotPrefix] = {}

    def hit(self, key: int, block_size: int, num_tokens: int,
            token_ids: Sequence[int] | Callable[[], Sequence[int]], now: float) -> HotPrefix:
        e = self._entries.get(key)
        if e is None:
            if len(self._entries) >= self.max_tracked:
                self._prune(now)
            ids = token_ids() if callable(token_ids) else token_ids
            e = HotPrefix(key, block_size, num_tokens, tuple(ids[:num_tokens]), 0.0, now)
            self._entries[key] = e
        e.score = self.score(e, now) + 1.0
        e.updated = now
        e.hits += 1
        return e

    def score(self, e: HotPrefix, now: float) -> float:
        return e.score * math.exp(-self._lambda * max(now - e.updated, 0.0))

    def rate(self, e: HotPrefix, now: float) -> float:
        """Hits per second the score stands for."""
        return self.score(e, now) * self._lambda

    def get(self, key: int) -> HotPrefix | None:
        return self._entries.get(key)

    def top(self, n: int, now: float) -> list[tuple[float, HotPrefix]]:
        scored = sorted(((self.score(e, now), e) for e in self._entries.values()), key=lambda x: -x[0])
        return scored[:n]

    def __len__(self) -> int:
        return len(self._entries)

    def _prune(self, now: float) -> None:
        keep = self.top(self.max_tracked // 2, now)
        self._entries = {e.key: e for _, e in keep}
