"""Block-id checks and run coalescing: turning (src block, dst block) pairs into contiguous byte runs.

A write names blocks pairwise: src_blocks[i] lands in dst_blocks[i]. Pairs are first ordered by
destination (destinations are unique, so each run then appears as consecutive entries), then cut
wherever either side stops being consecutive. Example:

    src 7 8 9 2 3   dst 0 1 2 5 6   ->   runs (src 7, dst 0, len 3), (src 2, dst 5, len 2)

All work is a handful of numpy calls, so Python cost does not grow with the block count. NIXL does
the same merge itself inside make_prepped_xfer (it only needs the pairs in this order); the tcp
backend sends one message per run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raypd.kvtransfer.errors import BlockIdError


def as_block_ids(ids: object, limit: int, what: str) -> np.ndarray:
    """ids as an int64 array, each in [0, limit)."""
    raw = np.asarray(ids)
    if raw.size and raw.dtype.kind not in "iu":
        raise BlockIdError(f"{what} must be integers, got dtype {raw.dtype}")
    arr = raw.astype(np.int64, copy=False).reshape(-1)
    if arr.size and (arr.min() < 0 or arr.max() >= limit):
        raise BlockIdError(f"{what} out of range [0, {limit}): min {arr.min()}, max {arr.max()}")
    return arr


def check_pairs(src: np.ndarray, dst: np.ndarray) -> None:
    if src.shape != dst.shape:
        raise BlockIdError(f"{src.size} source blocks but {dst.size} destination blocks")
    if dst.size != np.unique(dst).size:
        raise BlockIdError("destination block ids repeat: two sources would race for one block")


def check_slot(slot: int | None, limit: int, what: str) -> None:
    if slot is not None and not (isinstance(slot, (int, np.integer)) and 0 <= slot < limit):
        raise BlockIdError(f"{what} {slot!r} out of range [0, {limit})")


def order_pairs(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs sorted by destination, which puts every mergeable run in consecutive entries."""
    order = np.argsort(dst, kind="stable")
    return src[order], dst[order]


@dataclass(frozen=True, slots=True)
class Runs:
    src_start: np.ndarray   # first source block of each run
    dst_start: np.ndarray   # first destination block of each run
    length: np.ndarray      # blocks in each run

    def __len__(self) -> int:
        return int(self.length.size)


def coalesce_runs(src: np.ndarray, dst: np.ndarray) -> Runs:
    """Maximal runs (s, d, k) such that src s..s+k-1 go to dst d..d+k-1, in destination order."""
    if src.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Runs(empty, empty, empty)
    s, d = order_pairs(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))
    breaks = np.flatnonzero((np.diff(s) != 1) | (np.diff(d) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [s.size]))
    return Runs(s[starts], d[starts], ends - starts)
