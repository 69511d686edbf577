"""The chained block hash: the one place that defines how a KV block is named across processes.

hash(block) = blake2b-64(parent hash, the block's token ids). Chaining makes a block's name depend on
its whole prefix, so equal names mean equal KV. Python's hash() is not used because it is not
specified to be stable across interpreters, and the Conductor compares hashes from many nodes.
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

ROOT_HASH = 0  # the parent hash of a sequence's first block


def block_hash(parent: int, token_ids: Sequence[int]) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<Q", parent))
    h.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return int.from_bytes(h.digest(), "little")


def chained_block_hashes(token_ids: Sequence[int], block_size: int, parent: int = ROOT_HASH) -> list[int]:
    """Hashes of every full block of `token_ids`, each chained on the one before."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes
