"""KV events: what a node tells the Conductor about the blocks its prefix cache holds.

Every event carries a per-node sequence number, so a consumer can detect a gap (lost event) or a
restart (the sequence goes backwards) and ask for a full re-sync.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    seq: int
    parent_hash: int  # ROOT_HASH for a sequence's first block
    block_hashes: tuple[int, ...]  # chained, in prefix order, each extending the one before
    token_ids: tuple[int, ...]  # len(block_hashes) * block_size tokens
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    seq: int
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    seq: int


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
KVEventCallback = Callable[[KVEvent], None]
