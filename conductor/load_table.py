"""Per-slot load arrays: what each node last reported plus what the Conductor routed to it since.

Policies read these as numpy arrays indexed by slot, so scoring a thousand candidates is a handful
of vector operations instead of a Python loop. Reports are periodic and lag behind routing; without
the routed-since-report term every request between two reports would pile onto the same "lightest"
node (herding), so each routed request is remembered until a report stamped after it arrives.

What one request waits behind at a node is not the whole queue: the node serves more urgent work
first (protocol/queued_by_priority.py). Each slot keeps its queued prompt tokens, reported and
routed since, by priority in a row of MAX_LEVELS (priority, tokens) pairs, so a request's queue is
the slot's total less the row's tokens less urgent than it: one masked sum per candidate.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from raypd.protocol.kv_events import KVTier
from raypd.protocol.messages import LoadReport
from raypd.protocol.queued_by_priority import MAX_LEVELS, QueuedByPriority, summarize
from raypd.protocol.sampling_params import DEFAULT_PRIORITY

_FIELDS = ("queued", "speed", "waiting", "running", "inflight", "free_blocks", "total_blocks",
           "cached_blocks", "step_time", "kv_bytes_per_token", "pending_tokens", "pending_decode",
           "pending_decode_tokens")


class LoadTable:
    def __init__(self, capacity: int = 16):
        self.capacity = 0
        self.prefill_role = np.zeros(0, dtype=bool)
        self.decode_role = np.zeros(0, dtype=bool)
        self.alive = np.zeros(0, dtype=bool)
        self.host = np.zeros(0, dtype=np.int64)         # topology host index
        self.block_size = np.zeros(0, dtype=np.int64)
        # per slot, as last reported:
        self.queued = np.zeros(0)                # queued prefill tokens
        self.speed = np.zeros(0)                 # measured prefill tokens/s (0: not yet measured)
        self.waiting = np.zeros(0)
        self.running = np.zeros(0)
        self.inflight = np.zeros(0)
        self.free_blocks = np.zeros(0)
        self.total_blocks = np.zeros(0)
        self.cached_blocks = np.zeros(0)
        self.step_time = np.zeros(0)
        self.kv_bytes_per_token = np.zeros(0)    # KV bytes per token in the pool (0: not reported)
        # (KVTier, slot): measured bytes/s of loading blocks from that tier into the pool (0: not
        # measured yet, or no such tier; row POOL stays 0)
        self.tier_load_rate = np.zeros((len(KVTier), 0))
        # (slot, MAX_LEVELS): queued prompt tokens (reported + routed since) by priority, most urgent
        # first; the tokens not placed in a row are ahead of every request (unused pairs hold 0 tokens)
        self.level_priority = np.zeros((0, MAX_LEVELS), dtype=np.int64)
        self.level_tokens = np.zeros((0, MAX_LEVELS))
        self._reported_levels: dict[int, QueuedByPriority] = {}
        self._pending_levels: dict[int, dict[int, int]] = {}   # slot -> priority -> tokens routed since
        # per slot, routed since the last report:
        self.pending_tokens = np.zeros(0)        # prefill tokens
        self.pending_decode = np.zeros(0)        # requests
        self.pending_decode_tokens = np.zeros(0)  # their prompt tokens (KV the decode node will hold)
        self._pending: dict[int, deque] = {}         # slot -> (time, prefill tokens, priority)
        self._pending_dec: dict[int, deque] = {}     # slot -> (time, prompt tokens)
        self._prefill_slots = np.zeros(0, dtype=np.int64)
        self._decode_slots = np.zeros(0, dtype=np.int64)
        self._grow(capacity)

    # -- membership ---------------------------------------------------------------------------
    def add(self, slot: int, *, prefill: bool, decode: bool, host: int, block_size: int = 16) -> None:
        if slot >= self.capacity:
            self._grow(max(slot + 1, 2 * self.capacity))
        for f in _FIELDS:
            getattr(self, f)[slot] = 0.0
        self.tier_load_rate[:, slot] = 0.0
        self._reported_levels[slot] = ()
        self._pending_levels[slot] = {}
        self._write_levels(slot)
        self.prefill_role[slot], self.decode_role[slot] = prefill, decode
        self.host[slot], self.block_size[slot] = host, block_size
        self.alive[slot] = True
        self._pending[slot] = deque()
        self._pending_dec[slot] = deque()
        self._refresh()

    def set_roles(self, slot: int, *, prefill: bool, decode: bool) -> None:
        """A flex node's duty changed: which candidate sets it belongs to (neither while it drains)."""
        self.prefill_role[slot], self.decode_role[slot] = prefill, decode
        self._refresh()

    def remove(self, slot: int) -> None:
        self.alive[slot] = False
        self._pending.pop(slot, None)
        self._pending_dec.pop(slot, None)
        self._reported_levels.pop(slot, None)
        self._pending_levels.pop(slot, None)
        self._refresh()

    def prefill_slots(self) -> np.ndarray:
        return self._prefill_slots

    def decode_slots(self) -> np.ndarray:
        return self._decode_slots

    # -- updates ------------------------------------------------------------------------------
    def update(self, slot: int, r: LoadReport) -> None:
        self.queued[slot] = r.queued_prefill_tokens
        self.waiting[slot] = r.waiting
        self.running[slot] = r.running
        self.inflight[slot] = r.inflight
        self.free_blocks[slot] = r.free_blocks
        self.total_blocks[slot] = r.total_blocks
        self.cached_blocks[slot] = r.cached_blocks
        if r.step_time_s > 0:
            self.step_time[slot] = r.step_time_s
        if r.prefill_tokens_per_s > 0:
            self.speed[slot] = r.prefill_tokens_per_s
        if r.kv_bytes_per_token > 0:
            self.kv_bytes_per_token[slot] = r.kv_bytes_per_token
        for tier, rate in r.tier_load_bytes_per_s.items():
            if rate > 0 and 0 < tier < len(KVTier):
                self.tier_load_rate[tier, slot] = rate
        # A report stamped t covers every request routed before t; timestamp 0 means "now".
        pending = self._pending[slot]
        self.pending_tokens[slot] = _expire(pending, r.timestamp)
        by_priority: dict[int, int] = {}
        for _, tokens, priority in pending:
            by_priority[priority] = by_priority.get(priority, 0) + int(tokens)
        self._pending_levels[slot] = by_priority
        self._reported_levels[slot] = r.queued_prefill_by_priority
        self._write_levels(slot)
        dec = self._pending_dec[slot]
        tokens = _expire(dec, r.timestamp)
        self.pending_decode[slot] = len(dec)
        self.pending_decode_tokens[slot] = tokens

    def add_pending_prefill(self, slot: int, tokens: float, now: float, priority: int = DEFAULT_PRIORITY) -> None:
        self._pending[slot].append((now, tokens, priority))
        self.pending_tokens[slot] += tokens
        levels = self._pending_levels[slot]
        levels[priority] = levels.get(priority, 0) + int(tokens)
        self._write_levels(slot)

    def add_pending_decode(self, slot: int, prompt_tokens: float, now: float) -> None:
        self._pending_dec[slot].append((now, prompt_tokens))
        self.pending_decode[slot] += 1
        self.pending_decode_tokens[slot] += prompt_tokens

    # -- derived views ------------------------------------------------------------------------
    def prefill_queue_tokens(self, slots: np.ndarray) -> np.ndarray:
        return self.queued[slots] + self.pending_tokens[slots]

    def prefill_queue_ahead(self, slots: np.ndarray, priority: int) -> np.ndarray:
        """Of prefill_queue_tokens, what a new request at `priority` waits behind: all of it less
        the tokens queued at a less urgent priority (equal priorities: exactly the whole queue)."""
        behind = np.where(self.level_priority[slots] > priority, self.level_tokens[slots], 0.0).sum(axis=1)
        return np.maximum(self.prefill_queue_tokens(slots) - behind, 0.0)

    def decode_load(self, slots: np.ndarray) -> np.ndarray:
        """Sequences a decode node holds or is about to hold. A decode node's `waiting` already
        counts the requests whose KV is in flight (LoadReport.inflight is a part of it)."""
        return self.running[slots] + self.waiting[slots] + self.pending_decode[slots]

    def decode_room_tokens(self, slots: np.ndarray) -> np.ndarray:
        """Tokens of KV a decode node can still take; +inf before its first report."""
        known = self.total_blocks[slots] > 0
        room = self.free_blocks[slots] * self.block_size[slots] - self.pending_decode_tokens[slots]
        return np.where(known, room, np.inf)

    # -- internals ----------------------------------------------------------------------------
    def _grow(self, n: int) -> None:
        old = self.capacity
        for name in ("prefill_role", "decode_role", "alive", "host", "block_size", *_FIELDS):
            a = getattr(self, name)
            b = np.zeros(n, dtype=a.dtype)
            b[:old] = a[:old]
            setattr(self, name, b)
        rates = np.zeros((len(KVTier), n))
        rates[:, :old] = self.tier_load_rate[:, :old]
        self.tier_load_rate = rates
        for name in ("level_priority", "level_tokens"):
            a = getattr(self, name)
            b = np.zeros((n, MAX_LEVELS), dtype=a.dtype)
            b[:old] = a[:old]
            setattr(self, name, b)
        self.capacity = n

    def _write_levels(self, slot: int) -> None:
        """The slot's row: its last report's levels and those routed since, as one bounded summary."""
        levels = summarize([*self._reported_levels[slot], *self._pending_levels[slot].items()])
        self.level_priority[slot] = 0
        self.level_tokens[slot] = 0.0
        for k, (priority, tokens) in enumerate(levels):
            self.level_priority[slot, k], self.level_tokens[slot, k] = priority, tokens

    def _refresh(self) -> None:
        self._prefill_slots = np.flatnonzero(self.alive & self.prefill_role)
        self._decode_slots = np.flatnonzero(self.alive & self.decode_role)


def _expire(log: deque, stamp: float) -> float:
    if stamp <= 0:
        log.clear()
    else:
        while log and log[0][0] <= stamp:
            log.popleft()
    return float(sum(entry[1] for entry in log))
