from __future__ import annotations

import numpy as np
import pytest

from raypd.conductor.errors import HashSchemeMismatch, UnknownNodeError
from raypd.conductor.prefix_index import PrefixIndex
from raypd.protocol.block_hash import chained_block_hashes
from raypd.protocol.kv_events import BlockStored, KVTier
from tests.conductor.helpers import BS, EventMaker

A = list(range(100, 116))        # 4 blocks
B = list(range(200, 208))        # 2 blocks, a different first block


def make(*names: str) -> PrefixIndex:
    idx = PrefixIndex(default_block_size=BS)
    for slot, n in enumerate(names):
        idx.add_node(n, slot)
    return idx


def matched(idx: PrefixIndex, tokens: list[int]) -> dict[int, int]:
    m = idx.match(tokens, 8)
    return {s: int(t) for s, t in enumerate(m.tokens_by_slot) if t}


def test_stored_then_match_counts_leading_blocks_per_node():
    idx = make("a", "b", "c")
    ea, eb = EventMaker(), EventMaker()
    idx.apply("a", [ea.stored(A)])
    idx.apply("b", [eb.stored(A[:8])])
    # the prompt continues past A; the last prompt token never counts (the engine recomputes it)
    m = idx.match(A + [1, 2, 3], 3)
    assert m.tokens_by_slot.tolist() == [16, 8, 0]
    assert m.best_tokens == 16 and m.best_slots == [0]
    # a prompt exactly A: its last block holds the last token, so only 3 blocks are usable
    assert matched(idx, A) == {0: 12, 1: 8}
    assert matched(idx, B + [0]) == {}


def test_match_is_a_leading_run_not_any_block():
    idx = make("a")
    e = EventMaker()
    # the node holds blocks 2..4 of A's chain but not block 1: nothing leads, nothing matches
    hashes = chained_block_hashes(A, BS)
    idx.apply("a", [BlockStored(e._next(), hashes[0], tuple(hashes[1:]), tuple(A[BS:]), BS)])
    assert matched(idx, A + [0]) == {}


def test_removed_and_cleared():
    idx = make("a", "b")
    ea, eb = EventMaker(), EventMaker()
    idx.apply("a", [ea.stored(A)])
    idx.apply("b", [eb.stored(A)])
    hashes = chained_block_hashes(A, BS)
    idx.apply("a", [ea.removed(hashes[2:])])       # LRU evicts the tail
    assert matched(idx, A + [0]) == {0: 8, 1: 16}
    idx.apply("b", [eb.cleared()])
    assert matched(idx, A + [0]) == {0: 8}
    assert idx.num_blocks == 2 and idx.num_entries == 2
    # removing a block the node does not hold is harmless
    idx.apply("b", [eb.removed(hashes)])
    assert idx.num_blocks == 2


def tiered(idx: PrefixIndex, tokens: list[int]) -> dict[int, tuple[int, ...]]:
    """slot -> (pool run, pool past a gap, host, disk) tokens, for slots that hold any of it."""
    m = idx.match(tokens, 8)
    below = m.below(np.arange(8))
    return {s: (int(m.tokens_by_slot[s]), *map(int, below[:, s])) for s in range(8)
            if m.tokens_by_slot[s] or below[:, s].any()}


def test_tier_events_keep_each_block_at_its_tiers():
    idx = make("a", "b")
    ea, eb = EventMaker(), EventMaker()
    h = chained_block_hashes(A, BS)
    idx.apply("a", [ea.stored(A)])
    assert idx.match(A + [0], 2).tier_tokens is None     # no tier reported yet: the pool-only fast path
    # the pool evicts its last two blocks and writes them to host memory
    idx.apply("a", [ea.removed(h[2:]), ea.stored(A[8:], A[:8], KVTier.HOST)])
    assert tiered(idx, A + [0]) == {0: (8, 0, 8, 0)}
    # host memory demotes the last block to disk: the run goes on through it
    idx.apply("a", [ea.removed(h[3:], KVTier.HOST), ea.stored(A[12:], A[:12], KVTier.DISK)])
    assert tiered(idx, A + [0]) == {0: (8, 0, 4, 4)}
    assert idx.node_blocks("a") == 2 and idx.node_blocks("a", KVTier.HOST) == 1
    assert idx.node_blocks("a", KVTier.DISK) == 1 and idx.num_tier_entries == 2
    # block 2 is loaded back into the pool (its host copy stays): the pool run grows
    idx.apply("a", [ea.stored(A[8:12], A[:8])])
    assert tiered(idx, A + [0]) == {0: (12, 0, 0, 4)}
    # host drops block 2 and disk drops block 3: the run ends at the first block held nowhere
    idx.apply("a", [ea.removed(h[2:3], KVTier.HOST), ea.removed(h[3:], KVTier.DISK)])
    assert tiered(idx, A + [0]) == {0: (12, 0, 0, 0)}
    assert idx.num_tier_entries == 0
    # a node with nothing in its pool: the whole run is in tiers, each block at the fastest holding it
    idx.apply("b", [eb.stored(A, tier=KVTier.DISK), eb.stored(A[:8], tier=KVTier.HOST)])
    assert tiered(idx, A + [0]) == {0: (12, 0, 0, 0), 1: (0, 0, 8, 8)}
    # a block in two lower tiers stays held while either has it
    idx.apply("b", [eb.removed(h[:1], KVTier.DISK)])
    assert tiered(idx, A + [0])[1] == (0, 0, 8, 8)
    idx.apply("b", [eb.removed(h[:1], KVTier.HOST)])
    assert 1 not in tiered(idx, A + [0])
    # a pool block past a gap counts too (no load): pool 0..1 on b, host 2, pool 3
    idx.apply("b", [eb.stored(A[:8]), eb.stored(A[12:], A[:12])])
    idx.apply("b", [eb.stored(A[8:12], A[:8], KVTier.HOST)])
    assert tiered(idx, A + [0])[1] == (8, 4, 4, 0)


def test_all_blocks_cleared_empties_the_pool_only():
    idx = make("a")
    e = EventMaker()
    idx.apply("a", [e.stored(A), e.stored(A, tier=KVTier.HOST)])   # a write-through copy
    assert tiered(idx, A + [0]) == {0: (16, 0, 0, 0)}
    idx.apply("a", [e.cleared()])
    assert tiered(idx, A + [0]) == {0: (0, 0, 16, 0)}
    assert idx.num_entries == 0 and idx.num_tier_entries == 4


def test_resync_replaces_every_tier_and_remove_node_drops_them():
    idx = make("a", "b")
    ea, eb = EventMaker(), EventMaker()
    idx.apply("a", [ea.stored(A, tier=KVTier.HOST), ea.stored(B, tier=KVTier.DISK)])
    idx.apply("b", [eb.stored(B, tier=KVTier.DISK)])
    ea.seq += 1                                      # a lost batch
    assert idx.apply("a", [ea.stored(A)]).needs_resync
    snap = EventMaker()                              # kv_snapshot(): every tier, each event its own
    idx.resync("a", ea.seq, [snap.stored(A[:8]), snap.stored(A[8:], A[:8], KVTier.DISK)])
    assert tiered(idx, A + [0]) == {0: (8, 0, 0, 8)}
    assert tiered(idx, B + [0]) == {1: (0, 0, 0, 8)}  # a's disk copy of B was not in the snapshot
    assert idx.node_blocks("a", KVTier.HOST) == 0 and idx.num_tier_entries == 4
    assert idx.remove_node("a") == 2
    assert tiered(idx, A + [0]) == {} and idx.num_tier_entries == 2
    idx.remove_node("b")
    assert idx.match(B + [0], 2).tier_tokens is None


def test_tier_run_starts_where_a_longer_pool_run_ends():
    """What the core asks for a node whose pool run pending prefixes raised past the index's."""
    idx = make("a")
    e = EventMaker()
    idx.apply("a", [e.stored(A[:4]), e.stored(A[4:], A[:4], KVTier.DISK)])
    hashes = idx.hash_prompt(A + [0])
    assert idx.tier_run(0, hashes, 4).tolist() == [0, 0, 12]
    assert idx.tier_run(0, hashes, 8).tolist() == [0, 0, 8]
    assert idx.tier_run(0, hashes, 16).tolist() == [0, 0, 0]
    assert idx.tier_run(5, hashes, 0).tolist() == [0, 0, 0]   # no node in that slot


def test_gap_flags_resync_and_ignores_events_until_snapshot():
    idx = make("a")
    e = EventMaker()
    assert idx.apply("a", [e.stored(A[:8])]).applied == 1
    e.seq += 1                                       # one batch lost
    r = idx.apply("a", [e.stored(B), e.stored(A[8:], A[:8])])
    assert r.needs_resync and r.applied == 0 and r.dropped == 2
    assert idx.nodes_needing_resync() == ["a"]
    assert matched(idx, B + [0]) == {}               # events after the gap were not applied
    # the snapshot: everything the node caches now, as of its last event
    snap = EventMaker()
    idx.resync("a", e.seq, [snap.stored(A), snap.stored(B)])
    assert not idx.needs_resync("a")
    assert matched(idx, A + [0]) == {0: 16} and matched(idx, B + [0]) == {0: 8}
    # a batch that crossed the snapshot in flight is dropped, the next new one applies
    assert idx.apply("a", [BlockStored(e.seq, 0, (), (), BS)]).dropped == 1
    r = idx.apply("a", [e.removed(chained_block_hashes(B, BS))])
    assert r.applied == 1 and not r.needs_resync
    assert matched(idx, B + [0]) == {}


def test_backwards_sequence_is_a_restart():
    idx = make("a")
    e = EventMaker()
    idx.apply("a", [e.stored(A), e.stored(B)])
    restarted = EventMaker()                         # a new process counts from 1 again
    r = idx.apply("a", [restarted.stored(B)])
    assert r.needs_resync
    assert idx.needs_resync("a")


def test_first_event_must_be_seq_one():
    """A Conductor that starts after the node (or restarts) missed its history: re-sync."""
    idx = make("a")
    e = EventMaker()
    e.seq = 41
    assert idx.apply("a", [e.stored(A)]).needs_resync


def test_remove_node_drops_its_entries_at_once():
    idx = make("a", "b")
    ea, eb = EventMaker(), EventMaker()
    idx.apply("a", [ea.stored(A)])
    idx.apply("b", [eb.stored(A[:8]), eb.stored(B)])
    assert idx.remove_node("b") == 4
    assert matched(idx, A + [0]) == {0: 16}
    assert idx.num_blocks == 4 and idx.holders(chained_block_hashes(B, BS)[0]) == []
    with pytest.raises(UnknownNodeError):
        idx.apply("b", [])


def test_wide_masks_decode_every_slot():
    idx = PrefixIndex(default_block_size=BS)
    for s in range(300):
        idx.add_node(f"n{s}", s)
        e = EventMaker()
        idx.apply(f"n{s}", [e.stored(A[: BS * (1 + s % 4)])])
    m = idx.match(A + [0], 300)
    assert [int(m.tokens_by_slot[s]) for s in range(300)] == [BS * (1 + s % 4) for s in range(300)]


def test_hash_mismatch_raises_instead_of_matching_nothing():
    idx = make("a")
    bad = BlockStored(1, 0, (12345,), tuple(A[:BS]), BS)   # e.g. Python's hash() or another seed
    with pytest.raises(HashSchemeMismatch):
        idx.apply("a", [bad])


def test_engine_radix_cache_events_match_the_conductor_hashing():
    """The real engine cache emits events; the Conductor's match of the same tokens must see them.
    A different hash scheme on either side would make this match 0 (and raise above)."""
    from raypd.engine.cache.block_allocator import BlockAllocator
    from raypd.engine.cache.radix_cache import RadixCache

    events = []
    alloc = BlockAllocator(64)
    cache = RadixCache(alloc, block_size=16, on_event=events.append)
    prompt = list(range(1000, 1000 + 16 * 5 + 3))
    cache.insert(prompt, alloc.allocate(5))
    shorter = prompt[:32] + [7] * 40
    cache.insert(shorter, alloc.allocate(4))
    idx = PrefixIndex(default_block_size=16)
    idx.add_node("engine", 0)
    r = idx.apply("engine", events)
    assert r.applied == len(events) and not r.needs_resync
    m = idx.match(prompt + [1], 1)
    assert int(m.tokens_by_slot[0]) == 80
    assert int(idx.match(shorter + [1], 1).tokens_by_slot[0]) == 32 + 32
    # and the engine's own match of the same prompt agrees block for block
    assert cache.match_prefix(prompt + [1], 100).num_blocks * 16 == 80
