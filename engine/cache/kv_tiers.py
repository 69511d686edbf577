"""The tiers below a node's KV pool, fastest first (host memory, then disk), as the one lower tier
the radix cache talks to (radix_cache.LowerTier).

Where a block goes and comes from:

    pool --evict (write-back) or N-th hit (write-through-selective)--> first tier (host, else disk)
    host --full: least recently used moves down--> disk --full: least recently used is dropped
    pool <--a prompt's prefix runs past the pool: load from the fastest tier holding the block--

A block loaded back stays in its tier (the next eviction of it finds it there and writes nothing).
Policies (SGLang HiCache's names): write-back writes a block down when the pool evicts it;
write-through-selective writes it down once it has been matched `write_through_hits` times, while
the pool still has it, and an eviction writes nothing (cold blocks never cost a write).

Every change is a KV event on the node's one log (kv_event_log.py) with its tier, so the Conductor
can price a tier hit (protocol/kv_events.py). A block whose load fails a check is dropped from that
tier and the prompt computes it instead.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Literal, Protocol

import torch

from raypd.engine.cache.kv_event_log import KVEventLog
from raypd.engine.cache.kv_tier import TierStats
from raypd.protocol.block_hash import block_hash
from raypd.protocol.kv_events import BlockStored, KVTier

TierPolicy = Literal["write-back", "write-through-selective"]
TIER_POLICIES: tuple[TierPolicy, ...] = ("write-back", "write-through-selective")


class BlockTier(Protocol):
    """One tier: host_kv_tier.HostKVTier or kv_tier.DiskKVTier."""
    kind: KVTier
    stats: TierStats

    @property
    def num_blocks(self) -> int: ...

    def __contains__(self, block_hash: int) -> bool: ...
    def has_room(self) -> bool: ...
    def oldest(self) -> int | None: ...
    def items(self) -> Iterator[tuple[int, int, tuple[int, ...]]]: ...
    def entry(self, block_hash: int) -> tuple[int, tuple[int, ...]]: ...
    def touch(self, block_hash: int) -> None: ...
    def load_rate(self) -> float: ...
    def kv(self, block_hash: int) -> torch.Tensor: ...
    def put(self, block_hash: int, parent_hash: int, tokens: tuple[int, ...], kv: torch.Tensor) -> bool: ...
    def read_into(self, block_hash: int, parent_hash: int, tokens: tuple[int, ...], dst: torch.Tensor) -> bool: ...
    def drop(self, block_hash: int) -> None: ...


class KVTiers:
    def __init__(self, pool: torch.Tensor, tiers: Sequence[BlockTier], events: KVEventLog,
                 policy: TierPolicy = "write-back", write_through_hits: int = 2):
        assert tiers, "a tier stack holds at least one tier"
        self.pool = pool
        self.tiers = list(tiers)
        self.events = events
        self.block_size = pool.shape[4]
        # What the radix cache reads: write on eviction, or after this many matches (None: never).
        self.evict_writes = policy == "write-back"
        self.write_through_hits: int | None = write_through_hits if policy == "write-through-selective" else None
        self.lookup_blocks = 0  # prompt blocks past the pool asked of the tiers (the hit rate's base)

    def tier(self, kind: KVTier) -> BlockTier | None:
        return next((t for t in self.tiers if t.kind == kind), None)

    def __contains__(self, block_hash: int) -> bool:
        return any(block_hash in t for t in self.tiers)

    # -- radix cache interface --------------------------------------------------------------------
    def held_run(self, parent_hash: int, keys: Sequence[tuple[int, ...]]) -> list[tuple[int, tuple[int, ...]]]:
        """The leading blocks of `keys` (the prompt's blocks after the pool's match, which ends at
        parent_hash) that some tier holds, as (hash, tokens); counted as lookups."""
        self.lookup_blocks += len(keys)
        run = []
        for key in keys:
            parent_hash = block_hash(parent_hash, key)
            if parent_hash not in self:
                break
            run.append((parent_hash, key))
        return run

    def store_blocks(self, blocks: Sequence[tuple[int, int, tuple[int, ...], int]]) -> None:
        """Keep each (hash, parent hash, tokens, pool block) in the first tier; call before the pool
        block can be reused (the copy reads it, in stream order on a GPU)."""
        top = self.tiers[0]
        for hash_, parent, tokens, block in blocks:
            if hash_ in top:
                top.touch(hash_)
                continue
            if self._make_room(0) and top.put(hash_, parent, tokens, self.pool[block]):
                self.events.stored(parent, (hash_,), tokens, self.block_size, top.kind)

    def load(self, hash_: int, parent_hash: int, tokens: tuple[int, ...], block: int) -> bool:
        """Copy the block into pool block `block` from the fastest tier holding it; False when none
        does or its copy failed a check (dropped there): the caller computes those tokens."""
        for t in self.tiers:
            if hash_ not in t:
                continue
            if t.read_into(hash_, parent_hash, tokens, self.pool[block]):
                return True
            if hash_ not in t:
                self.events.removed((hash_,), t.kind)
        return False

    def snapshot(self, seq: int) -> list[BlockStored]:
        """One BlockStored per block each tier holds, with its tier (a re-syncing consumer's view)."""
        return [BlockStored(seq=seq, parent_hash=parent, block_hashes=(h,), token_ids=tokens,
                            block_size=self.block_size, tier=t.kind)
                for t in self.tiers for h, parent, tokens in t.items()]

    # -- reports ------------------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Running totals per tier, as kv_tier_<tier>_<stat>, and kv_tier_lookup_blocks."""
        out: dict[str, float] = {"kv_tier_lookup_blocks": self.lookup_blocks}
        for t in self.tiers:
            name = t.kind.name.lower()
            out.update({f"kv_tier_{name}_{k}": v for k, v in asdict(t.stats).items()})
            out[f"kv_tier_{name}_blocks"] = t.num_blocks
        return out

    def load_rates(self) -> dict[int, float]:
        """KVTier -> measured bytes/s of loads into the pool (0: none measured yet)."""
        return {int(t.kind): t.load_rate() for t in self.tiers}

    # -- internals ----------------------------------------------------------------------------------
    def _make_room(self, i: int) -> bool:
        """Room for one block in tier i, moving its least recently used blocks down (or out, from
        the last tier); False when the tier cannot hold even one block."""
        t = self.tiers[i]
        while not t.has_room():
            victim = t.oldest()
            if victim is None:
                return False
            if i + 1 < len(self.tiers):
                self._move_down(i, victim)
            t.drop(victim)
            t.stats.evicted += 1
            self.events.removed((victim,), t.kind)
        return True

    def _move_down(self, i: int, hash_: int) -> None:
        upper, lower = self.tiers[i], self.tiers[i + 1]
        if hash_ in lower:
            lower.touch(hash_)
            return
        parent, tokens = upper.entry(hash_)
        kv = upper.kv(hash_)
        if self._make_room(i + 1) and lower.put(hash_, parent, tokens, kv):
            self.events.stored(parent, (hash_,), tokens, self.block_size, lower.kind)
