"""KV events: what a node tells the Conductor about the blocks its prefix cache holds.

Every event carries a per-node sequence number, so a consumer can detect a gap (lost event) or a
restart (the sequence goes backwards) and ask for a full re-sync.

Each stored or removed block names its tier (KVTier): the pool, where attention reads it, or a tier
below it (engine/cache/kv_tiers.py), from which the node can load it back into the pool faster than
it can compute it. One block may be in several tiers at once (a block loaded back from disk stays on
disk; a write-through copy sits in host memory while the pool still has it); events of one tier say
nothing of the others. AllBlocksCleared concerns the pool only.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum


class KVTier(IntEnum):
    """Where a node keeps a KV block, fastest first."""
    POOL = 0   # the KV pool (device memory on a GPU node): usable as it is
    HOST = 1   # host memory (pinned on a GPU node): loaded back by one copy
    DISK = 2   # the node's tier directory: read, checked and copied back


@dataclass(frozen=True, slots=True)
class BlockStored:
    seq: int
    parent_hash: int  # ROOT_HASH for a sequence's first block
    block_hashes: tuple[int, ...]  # chained, in prefix order, each extending the one before
    token_ids: tuple[int, ...]  # len(block_hashes) * block_size tokens
    block_size: int
    tier: KVTier = KVTier.POOL


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    seq: int
    block_hashes: tuple[int, ...]
    tier: KVTier = KVTier.POOL


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    seq: int


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
KVEventCallback = Callable[[KVEvent], None]
