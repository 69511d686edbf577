"""Global prefix index: which nodes hold which KV blocks, fed by the nodes' KV events.

Data layout, chosen so a match costs one dict lookup and one big-int AND per block of the prompt:

    _holders: block hash -> int bitmask, bit s set when the node in slot s holds the block in its pool
    _blocks:  slot -> set of block hashes that node's pool holds (to drop a node at once)
    _lower:   the same for the tiers below the pools (host memory, disk), in lower_tiers.py

A request's match on a node is the run of *leading* blocks that node holds in its pool. `match`
walks the prompt's hash chain once, AND-ing the set of nodes still matching with each block's
holders, and stops as soon as no node matches; a node that drops out at depth d matched d blocks.
Once some node reports a lower tier, a second walk over pool | lower masks finds each node's run
held in any tier; only the blocks past its pool run are looked up tier by tier (tier_tokens).
Events of one tier say nothing of the others: AllBlocksCleared empties the pool only; a re-sync
snapshot or a node's removal replaces or drops every tier.

Sequence numbers (per node, from engine.kv_events): events must arrive as last_seq + 1. A gap
(lost batch) or a sequence that goes backwards (node restart) leaves the node's entries unknowable,
so the node is flagged for a full re-sync and its further events are ignored until `resync`
replaces its entries with a snapshot. Right after a re-sync, events numbered at or below the
snapshot's sequence are batches that crossed the snapshot in flight: they are dropped, not treated
as a restart.

Hashes are engine.block_hash's, the one naming scheme; with verify_hashes every BlockStored is
recomputed from its token ids, so a node that names blocks differently raises HashSchemeMismatch
instead of silently matching nothing.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from raypd.conductor.errors import HashSchemeMismatch, UnknownNodeError
from raypd.conductor.lower_tiers import NUM_TIERS, LowerTiers, unset
from raypd.protocol.block_hash import chained_block_hashes
from raypd.protocol.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVTier


class SyncState(IntEnum):
    SYNCED = 0
    NEEDS_RESYNC = 1


@dataclass(slots=True)
class _NodeEntry:
    name: str
    slot: int
    last_seq: int = 0                # a fresh node's first event is seq 1
    state: SyncState = SyncState.SYNCED
    after_resync: bool = False       # drop stale seq <= last_seq until last_seq + 1 arrives
    block_size: int = 0              # learned from the node's events; 0 until the first one
    resync_reason: str = ""


@dataclass(slots=True)
class ApplyResult:
    applied: int = 0
    dropped: int = 0                 # ignored: stale, or the node awaits a re-sync
    needs_resync: bool = False


@dataclass(slots=True)
class PrefixMatch:
    """One prompt's match against every node. tokens_by_slot[s] = prompt tokens in slot s's pool run
    (its leading blocks in the pool). tier_tokens[t, s] = tokens of the run that goes on past it,
    each block counted at the fastest tier t of slot s holding it (row POOL: pool blocks past a gap,
    rare), up to the first block slot s holds in no tier. None: no node reports a lower tier."""
    num_tokens: int
    hashes: dict[int, list[int]]     # block size -> the prompt's chained block hashes
    tokens_by_slot: np.ndarray       # int64, one entry per slot
    best_tokens: int = 0             # the longest pool run
    best_slots: list[int] = field(default_factory=list)
    tier_tokens: np.ndarray | None = None   # int64, (NUM_TIERS, slots)

    @classmethod
    def of(cls, num_tokens: int, hashes: dict[int, list[int]], tokens_by_slot: np.ndarray,
           tier_tokens: np.ndarray | None = None) -> PrefixMatch:
        best = int(tokens_by_slot.max()) if len(tokens_by_slot) else 0
        best_slots = np.flatnonzero(tokens_by_slot == best).tolist() if best else []
        return cls(num_tokens, hashes, tokens_by_slot, best, best_slots, tier_tokens)

    def tokens(self, slot: int) -> int:
        return int(self.tokens_by_slot[slot]) if slot < len(self.tokens_by_slot) else 0

    def below(self, slots: np.ndarray) -> np.ndarray:
        """(NUM_TIERS, len(slots)): tier_tokens of these slots (zeros without tiers)."""
        out = np.zeros((NUM_TIERS, len(slots)), dtype=np.int64)
        if self.tier_tokens is not None and len(slots):
            ok = slots < self.tier_tokens.shape[1]
            out[:, ok] = self.tier_tokens[:, slots[ok]]
        return out

    @property
    def any_tier_hit(self) -> bool:
        return self.tier_tokens is not None and bool(self.tier_tokens.any())

    def deepest_hash(self) -> tuple[int, int] | None:
        """(block size, hash of the last block of the best match): the key naming that prefix."""
        for bs, hashes in self.hashes.items():
            n = self.best_tokens // bs
            if n and self.best_tokens % bs == 0:
                return bs, hashes[n - 1]
        return None


class PrefixIndex:
    def __init__(self, *, verify_hashes: bool = True, default_block_size: int = 16):
        self.verify_hashes = verify_hashes
        self.default_block_size = default_block_size
        self._holders: dict[int, int] = {}
        self._blocks: dict[int, set[int]] = {}
        self._lower = LowerTiers()
        self._nodes: dict[str, _NodeEntry] = {}
        self._by_slot: dict[int, _NodeEntry] = {}
        self._block_size_users: dict[int, int] = {}  # block size -> number of nodes using it
        self.num_resyncs = 0
        self.num_dropped_events = 0

    # -- membership ---------------------------------------------------------------------------
    def add_node(self, name: str, slot: int) -> None:
        if name in self._nodes:
            self.remove_node(name)
        if slot in self._by_slot:
            raise ValueError(f"slot {slot} is taken by {self._by_slot[slot].name!r}")
        entry = _NodeEntry(name=name, slot=slot)
        self._nodes[name] = entry
        self._by_slot[slot] = entry
        self._blocks[slot] = set()
        self._lower.add_slot(slot)

    def remove_node(self, name: str) -> int:
        """Drop a node and every index entry it had, in every tier; returns how many blocks its pool
        held."""
        entry = self._entry(name)
        dropped = self._clear(entry)
        self._lower.drop_slot(entry.slot)
        self._set_block_size(entry, 0)
        del self._nodes[name], self._by_slot[entry.slot], self._blocks[entry.slot]
        return dropped

    # -- events -------------------------------------------------------------------------------
    def apply(self, name: str, events: Iterable[KVEvent]) -> ApplyResult:
        entry = self._entry(name)
        result = ApplyResult()
        for ev in events:
            if entry.state is SyncState.NEEDS_RESYNC:
                result.dropped += 1
                continue
            expected = entry.last_seq + 1
            if ev.seq != expected:
                if ev.seq < expected and entry.after_resync:
                    result.dropped += 1      # crossed the snapshot in flight; already in it
                    continue
                self._flag(entry, "gap" if ev.seq > expected else "sequence went backwards")
                result.dropped += 1
                continue
            entry.after_resync = False
            entry.last_seq = ev.seq
            self._apply_one(entry, ev)
            result.applied += 1
        result.needs_resync = entry.state is SyncState.NEEDS_RESYNC
        self.num_dropped_events += result.dropped
        return result

    def resync(self, name: str, last_seq: int, events: Sequence[BlockStored]) -> None:
        """Replace the node's entries with a snapshot: `events` cover every block it caches now, in
        every tier (each names its own), `last_seq` is the sequence number of the last event the
        snapshot reflects."""
        entry = self._entry(name)
        self._clear(entry)
        self._lower.clear(entry.slot)
        for ev in events:
            if not isinstance(ev, BlockStored):
                raise TypeError(f"a snapshot holds BlockStored events, got {type(ev).__name__}")
            self._store(entry, ev)
        entry.last_seq = last_seq
        entry.state = SyncState.SYNCED
        entry.after_resync = True
        entry.resync_reason = ""
        self.num_resyncs += 1

    def needs_resync(self, name: str) -> bool:
        return self._entry(name).state is SyncState.NEEDS_RESYNC

    def nodes_needing_resync(self) -> list[str]:
        return [e.name for e in self._nodes.values() if e.state is SyncState.NEEDS_RESYNC]

    def request_resync(self, name: str, reason: str) -> None:
        self._flag(self._entry(name), reason)

    # -- queries ------------------------------------------------------------------------------
    def block_sizes(self) -> list[int]:
        return sorted(self._block_size_users) or [self.default_block_size]

    def hash_prompt(self, token_ids: Sequence[int]) -> dict[int, list[int]]:
        """The prompt's chained hashes for every block size in use (normally exactly one)."""
        return {bs: prompt_block_hashes(token_ids, bs) for bs in self.block_sizes()}

    def match(self, token_ids: Sequence[int], num_slots: int,
              hashes: dict[int, list[int]] | None = None) -> PrefixMatch:
        if hashes is None:
            hashes = self.hash_prompt(token_ids)
        tokens_by_slot = np.zeros(max(num_slots, 1), dtype=np.int64)
        for bs, chain in hashes.items():
            users = self._slots_mask(bs) if len(hashes) > 1 else -1
            for slot, blocks in self._walk(chain, users):
                tokens_by_slot[slot] = blocks * bs
        tiers = self._tier_runs(hashes, tokens_by_slot) if self._lower else None
        return PrefixMatch.of(len(token_ids), hashes, tokens_by_slot, tiers)

    def _tier_runs(self, hashes: dict[int, list[int]], pool_runs: np.ndarray) -> np.ndarray:
        """PrefixMatch.tier_tokens, given each slot's pool run: a second walk, over pool | lower."""
        tiers = np.zeros((NUM_TIERS, len(pool_runs)), dtype=np.int64)
        for bs, chain in hashes.items():
            users = self._slots_mask(bs) if len(hashes) > 1 else -1
            for slot, end in self._walk(chain, users, self._anywhere):
                start = int(pool_runs[slot]) // bs
                if end > start:
                    tiers[:, slot] = self._lower.split(slot, chain, start, end, self._blocks[slot]) * bs
        return tiers

    def tier_run(self, slot: int, hashes: dict[int, list[int]], start_tokens: int) -> np.ndarray:
        """(NUM_TIERS,) tokens of slot's run from `start_tokens` (block-aligned) on while it holds each
        block in some tier, split like PrefixMatch.tier_tokens: for a node whose pool run reaches
        further than the index says (pending_prefixes.py)."""
        out = np.zeros(NUM_TIERS, dtype=np.int64)
        entry = self._by_slot.get(slot)
        if entry is None or not self._lower:
            return out
        bs = entry.block_size or self.default_block_size
        chain, start = hashes.get(bs, []), start_tokens // bs
        for _, depth in self._walk(chain[start:], 1 << slot, self._anywhere):
            out = self._lower.split(slot, chain, start, start + depth, self._blocks[slot]) * bs
        return out

    @property
    def holder_masks(self) -> dict[int, int]:
        """block hash -> bitmask of holder slots; the live dict, for read-only walks (pending_prefixes)."""
        return self._holders

    def holders(self, block_hash: int) -> list[int]:
        return bits(self._holders.get(block_hash, 0))

    def holders_mask(self, block_hash: int) -> int:
        return self._holders.get(block_hash, 0)

    def node_blocks(self, name: str, tier: KVTier = KVTier.POOL) -> int:
        slot = self._entry(name).slot
        return len(self._blocks[slot]) if tier == KVTier.POOL else self._lower.blocks(slot, KVTier(tier))

    def node_block_size(self, name: str) -> int:
        return self._entry(name).block_size or self.default_block_size

    def last_seq(self, name: str) -> int:
        return self._entry(name).last_seq

    @property
    def num_blocks(self) -> int:
        """Distinct block hashes held by at least one node."""
        return len(self._holders)

    @property
    def num_entries(self) -> int:
        """(node, pool block) pairs."""
        return sum(len(s) for s in self._blocks.values())

    @property
    def num_tier_entries(self) -> int:
        """(node, block, tier below the pool) triples."""
        return self._lower.num_entries

    def __contains__(self, name: str) -> bool:
        return name in self._nodes

    # -- internals ----------------------------------------------------------------------------
    def _entry(self, name: str) -> _NodeEntry:
        try:
            return self._nodes[name]
        except KeyError:
            raise UnknownNodeError(name) from None

    def _flag(self, entry: _NodeEntry, reason: str) -> None:
        entry.state = SyncState.NEEDS_RESYNC
        entry.after_resync = False
        entry.resync_reason = reason

    def _apply_one(self, entry: _NodeEntry, ev: KVEvent) -> None:
        if isinstance(ev, BlockStored):
            self._store(entry, ev)
        elif isinstance(ev, BlockRemoved) and ev.tier != KVTier.POOL:
            self._lower.remove(entry.slot, KVTier(ev.tier), ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            bit, mine = 1 << entry.slot, self._blocks[entry.slot]
            for h in ev.block_hashes:
                if h in mine:
                    mine.discard(h)
                    unset(self._holders, h, bit)
        elif isinstance(ev, AllBlocksCleared):
            self._clear(entry)
        else:
            raise TypeError(f"not a KV event: {type(ev).__name__}")

    def _store(self, entry: _NodeEntry, ev: BlockStored) -> None:
        if self.verify_hashes:
            expected = chained_block_hashes(ev.token_ids, ev.block_size, ev.parent_hash)
            if expected != list(ev.block_hashes):
                bad = next(i for i, (a, b) in enumerate(zip(expected, ev.block_hashes)) if a != b) \
                    if len(expected) == len(ev.block_hashes) else 0
                got = ev.block_hashes[bad] if ev.block_hashes else 0
                raise HashSchemeMismatch(entry.name, expected[bad] if expected else 0, got)
        if entry.block_size != ev.block_size:
            self._set_block_size(entry, ev.block_size)
        if ev.tier != KVTier.POOL:
            self._lower.store(entry.slot, KVTier(ev.tier), ev.block_hashes)
            return
        bit, mine, holders = 1 << entry.slot, self._blocks[entry.slot], self._holders
        for h in ev.block_hashes:
            if h not in mine:
                mine.add(h)
                holders[h] = holders.get(h, 0) | bit

    def _clear(self, entry: _NodeEntry) -> int:
        """The node's pool entries (its lower tiers stay)."""
        mine = self._blocks[entry.slot]
        bit = 1 << entry.slot
        for h in mine:
            unset(self._holders, h, bit)
        n = len(mine)
        mine.clear()
        return n

    def _set_block_size(self, entry: _NodeEntry, bs: int) -> None:
        if entry.block_size:
            left = self._block_size_users[entry.block_size] - 1
            if left:
                self._block_size_users[entry.block_size] = left
            else:
                del self._block_size_users[entry.block_size]
        entry.block_size = bs
        if bs:
            self._block_size_users[bs] = self._block_size_users.get(bs, 0) + 1

    def _slots_mask(self, bs: int) -> int:
        m = 0
        for e in self._nodes.values():
            if e.block_size == bs:
                m |= 1 << e.slot
        return m

    def _anywhere(self, h: int, default: int) -> int:
        """Slots holding block `h` in any tier."""
        return self._holders.get(h, default) | self._lower.masks.get(h, default)

    def _walk(self, chain: list[int], candidates: int, get: Callable[[int, int], int] | None = None):
        """Yield (slot, leading blocks held) for every slot that matched at least one block: held in
        its pool, or in whatever `get(hash, 0)` says (a mask of slots)."""
        if get is None:
            get = self._holders.get
        cur = candidates
        depth = 0
        for h in chain:
            nxt = cur & get(h, 0)
            if nxt != cur:
                if depth:
                    for slot in bits(cur & ~nxt):
                        yield slot, depth
                cur = nxt
                if not cur:
                    return
            depth += 1
        if depth and cur > 0:
            for slot in bits(cur):
                yield slot, depth


def prompt_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The hashes a prompt is matched by: engine.block_hash's chain over the blocks inside the
    first len - 1 tokens. The engine always computes the last prompt token (it needs its logits),
    so it never reuses the block holding it (engine/scheduler.py matches at most
    (n - 1) // block_size blocks). An ingress may call this and pass the result to route()."""
    return chained_block_hashes(token_ids[:max(len(token_ids) - 1, 0)], block_size)


def bits(mask: int) -> list[int]:
    """Slots set in a non-negative bitmask (numpy for wide masks: a Python loop over a thousand
    bits costs more than the rest of a decision)."""
    if mask <= 0:
        return []
    if mask.bit_count() <= 16:
        out = []
        while mask:
            low = mask & -mask
            out.append(low.bit_length() - 1)
            mask ^= low
        return out
    raw = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"), dtype=np.uint8)
    return np.flatnonzero(np.unpackbits(raw, bitorder="little")).tolist()
