"""A node's host-memory tier below the pool: KV blocks kept in one preallocated host tensor of
fixed slots, by chained block hash. On a GPU node the tensor is pinned, so a block moves between
the pool and this tier by one asynchronous copy on the engine's stream (HBM -> host on the way
down, host -> HBM on the way back), ordered with the kernels that read or overwrite the pool block.
On a CPU node it is plain memory beside the pool: still a tier, but one that only pays off when RAM
is larger than what the pool may take.

Why slots in one tensor rather than a tensor per block: pinned allocations are slow and fragment;
one allocation at start, sized by --kv-host-tier-size, is what the node owns for its life.

The bytes never leave this process and are written only by copies from the pool, so nothing here is
checked on the way back (the disk tier checks its files; kv_tier.py).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator

import torch

from raypd.engine.cache.kv_tier import TierStats
from raypd.protocol.kv_events import KVTier

_CALIBRATION_COPIES = 8


class HostKVTier:
    kind = KVTier.HOST

    def __init__(self, size_bytes: int, pool: torch.Tensor):
        self.block_bytes = pool[0].numel() * pool.element_size()
        self.capacity = size_bytes // self.block_bytes
        self.on_gpu = pool.device.type == "cuda"
        self.data = torch.empty((self.capacity, *pool.shape[1:]), dtype=pool.dtype, pin_memory=self.on_gpu)
        self.stats = TierStats()
        # block hash -> (slot, parent hash, tokens), least recently used first
        self._slots: OrderedDict[int, tuple[int, int, tuple[int, ...]]] = OrderedDict()
        self._free = list(range(self.capacity - 1, -1, -1))
        self._copies_in_flight = False  # a device -> host copy may not have landed yet
        self._device = pool.device
        # On a GPU a load only enqueues a copy, so its wall time says nothing of the rate: measure
        # the rate once, here, by timed synchronous copies into a pool block's shape.
        self.calibrated_rate = self._calibrate(pool) if self.on_gpu and self.capacity else 0.0

    @property
    def num_blocks(self) -> int:
        return len(self._slots)

    @property
    def used_bytes(self) -> int:
        return len(self._slots) * self.block_bytes

    def __contains__(self, block: int) -> bool:
        return block in self._slots

    def has_room(self) -> bool:
        return bool(self._free)

    def oldest(self) -> int | None:
        return next(iter(self._slots), None)

    def items(self) -> Iterator[tuple[int, int, tuple[int, ...]]]:
        return ((h, parent, tokens) for h, (_, parent, tokens) in self._slots.items())

    def entry(self, hash_: int) -> tuple[int, tuple[int, ...]]:
        _, parent, tokens = self._slots[hash_]
        return parent, tokens

    def touch(self, hash_: int) -> None:
        self._slots.move_to_end(hash_)

    def load_rate(self) -> float:
        return self.calibrated_rate if self.on_gpu else self.stats.load_rate()

    def put(self, hash_: int, parent_hash: int, tokens: tuple[int, ...], kv: torch.Tensor) -> bool:
        slot = self._free.pop()
        self.data[slot].copy_(kv, non_blocking=self.on_gpu)
        self._copies_in_flight |= self.on_gpu
        self._slots[hash_] = (slot, parent_hash, tuple(tokens))
        self.stats.stored += 1
        self.stats.bytes_written += self.block_bytes
        return True

    def read_into(self, hash_: int, parent_hash: int, tokens: tuple[int, ...], dst: torch.Tensor) -> bool:
        entry = self._slots.get(hash_)
        if entry is None or entry[1:] != (parent_hash, tuple(tokens)):
            return False
        start = time.perf_counter()
        dst.copy_(self.data[entry[0]], non_blocking=self.on_gpu)
        self._slots.move_to_end(hash_)
        self.stats.loaded += 1
        self.stats.bytes_read += self.block_bytes
        self.stats.load_seconds += time.perf_counter() - start
        return True

    def kv(self, hash_: int) -> torch.Tensor:
        """The block's KV as this tier holds it, complete (for moving it down to the next tier)."""
        if self._copies_in_flight:
            torch.cuda.current_stream(self._device).synchronize()
            self._copies_in_flight = False
        return self.data[self._slots[hash_][0]]

    def drop(self, hash_: int) -> None:
        entry = self._slots.pop(hash_, None)
        if entry is not None:
            # A copy out of this slot may still be queued on the stream; the next copy into it is
            # queued behind it, so reusing the slot at once is safe.
            self._free.append(entry[0])

    def _calibrate(self, pool: torch.Tensor) -> float:
        block = torch.empty_like(pool[0])
        stream = torch.cuda.current_stream(pool.device)
        block.copy_(self.data[0], non_blocking=True)  # first-touch costs out of the timing
        stream.synchronize()
        start = time.perf_counter()
        for _ in range(_CALIBRATION_COPIES):
            block.copy_(self.data[0], non_blocking=True)
        stream.synchronize()
        return _CALIBRATION_COPIES * self.block_bytes / max(time.perf_counter() - start, 1e-9)
