from __future__ import annotations

import pytest

from raypd.conductor.errors import HashSchemeMismatch, UnknownNodeError
from raypd.conductor.prefix_index import PrefixIndex
from raypd.protocol.block_hash import chained_block_hashes
from raypd.protocol.kv_events import BlockStored
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
