"""One node's KV events, numbered in the order they happen (protocol/kv_events.py).

The prefix cache and the tiers below it (kv_tiers.py) both change what the node holds; they publish
through one log so a consumer sees a single gap-free sequence per node whichever part spoke.
"""
from __future__ import annotations

from collections.abc import Iterable

from raypd.protocol.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventCallback, KVTier


class KVEventLog:
    def __init__(self, on_event: KVEventCallback | None = None):
        self._on_event = on_event
        self.seq = 0  # the number of the last event published (0: none yet)

    def stored(self, parent_hash: int, block_hashes: Iterable[int], token_ids: Iterable[int], block_size: int,
               tier: KVTier = KVTier.POOL) -> None:
        """A chain of blocks, each extending the one before, now held in `tier`."""
        self._emit(BlockStored(seq=self.seq + 1, parent_hash=parent_hash, block_hashes=tuple(block_hashes),
                               token_ids=tuple(token_ids), block_size=block_size, tier=tier))

    def removed(self, block_hashes: Iterable[int], tier: KVTier = KVTier.POOL) -> None:
        hashes = tuple(block_hashes)
        if hashes:
            self._emit(BlockRemoved(seq=self.seq + 1, block_hashes=hashes, tier=tier))

    def cleared(self) -> None:
        self._emit(AllBlocksCleared(seq=self.seq + 1))

    def _emit(self, event: KVEvent) -> None:
        self.seq += 1
        if self._on_event is not None:
            self._on_event(event)
