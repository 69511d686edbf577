"""RadixCache and the chained block hash: match lengths, canonical blocks, locks, exact LRU eviction
order, and the KV event stream. Tiny pools (block_size 2), exact block ids."""
from __future__ import annotations

import hashlib
import struct

import pytest

from raypd.engine.cache.block_allocator import BlockAllocator
from raypd.engine.cache.radix_cache import RadixCache, RadixNode
from raypd.protocol.block_hash import ROOT_HASH, block_hash, chained_block_hashes
from raypd.protocol.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

BS = 2


# -- helpers --------------------------------------------------------------------------------------
def make_cache(num_blocks: int = 8, block_size: int = BS):
    alloc = BlockAllocator(num_blocks)
    events: list = []
    cache = RadixCache(alloc, block_size, on_event=events.append)
    return alloc, cache, events


def nodes(cache: RadixCache) -> list[RadixNode]:
    out, stack = [], list(cache.root.children.values())
    while stack:
        x = stack.pop()
        out.append(x)
        stack.extend(x.children.values())
    return out


def store(alloc: BlockAllocator, cache: RadixCache, tokens: list[int]) -> list[int]:
    """What a finishing request does: compute KV into fresh blocks, insert them, drop its own refs.
    Returns the canonical block ids."""
    blocks = alloc.allocate(len(tokens) // cache.block_size)
    _, canonical = cache.insert(tokens, blocks)
    alloc.decref(blocks)
    return canonical


def assert_accounting(alloc: BlockAllocator, cache: RadixCache, held: list[int] = ()) -> None:
    """Every reference is explained: one per cached block, one per block id in `held` (the test's
    stand-in for request block tables); counters agree with the tree."""
    tree = nodes(cache)
    cached = cache.cached_blocks()
    assert len(tree) == len(cached) == cache.num_cached_blocks, "one node per cached block"
    expected = [0] * alloc.num_blocks
    for b in cached:
        expected[b] += 1
    for b in held:
        expected[b] += 1
    assert [alloc.ref_count(b) for b in range(alloc.num_blocks)] == expected
    assert alloc.num_free == expected.count(0)
    assert alloc.num_free + len(cached) + len(set(held) - cached) == alloc.num_blocks
    assert cache.num_evictable_blocks == sum(1 for x in tree if x.lock_ref == 0)
    for x in tree:  # a node is locked at least as often as all its children together
        assert x.lock_ref >= sum(c.lock_ref for c in x.children.values())


def evicted_hashes(events) -> list[int]:
    return [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]


def hashes_of(tokens: list[int]) -> list[int]:
    return chained_block_hashes(tokens, BS)


# -- chained block hash ---------------------------------------------------------------------------
def test_block_hash_is_blake2b_64_of_parent_then_tokens():
    # Spelled out independently: the Conductor compares these across processes, so the byte
    # layout (little-endian u64 parent, little-endian u32 tokens, 8-byte digest) is the contract.
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<Q", 12345))
    h.update(struct.pack("<3I", 7, 8, 9))
    assert block_hash(12345, [7, 8, 9]) == int.from_bytes(h.digest(), "little")
    assert ROOT_HASH == 0


def test_block_hash_is_deterministic_and_64_bit():
    assert block_hash(ROOT_HASH, [1, 2]) == block_hash(ROOT_HASH, (1, 2))
    assert 0 <= block_hash(ROOT_HASH, [1, 2]) < 2**64
    assert block_hash(ROOT_HASH, [1, 2]) != block_hash(ROOT_HASH, [2, 1])
    assert block_hash(ROOT_HASH, [1, 2]) != block_hash(ROOT_HASH, [1, 3])


def test_block_hash_depends_on_parent():
    assert block_hash(ROOT_HASH, [1, 2]) != block_hash(1, [1, 2])


def test_chained_hashes_chain_each_block_on_the_one_before():
    h1 = block_hash(ROOT_HASH, [1, 2])
    h2 = block_hash(h1, [3, 4])
    h3 = block_hash(h2, [5, 6])
    assert chained_block_hashes([1, 2, 3, 4, 5, 6], 2) == [h1, h2, h3]
    assert chained_block_hashes([1, 2, 3, 4, 5, 6], 3) == [block_hash(ROOT_HASH, [1, 2, 3]),
                                                          block_hash(block_hash(ROOT_HASH, [1, 2, 3]), [4, 5, 6])]


def test_equal_token_runs_under_different_prefixes_hash_differently():
    a = chained_block_hashes([1, 2, 5, 6], 2)
    b = chained_block_hashes([3, 4, 5, 6], 2)
    assert a[0] != b[0]
    assert a[1] != b[1]  # same tokens (5, 6), different parents
    assert chained_block_hashes([1, 2, 5, 6], 2) == a  # and the same prefix gives the same names


def test_chained_hashes_cover_only_full_blocks():
    assert chained_block_hashes([], 2) == []
    assert chained_block_hashes([1], 2) == []
    assert chained_block_hashes([1, 2, 3], 2) == chained_block_hashes([1, 2], 2)
    assert len(chained_block_hashes([1, 2, 3, 4, 5], 2)) == 2
    assert len(chained_block_hashes([1, 2, 3, 4, 5], 4)) == 1
    assert len(chained_block_hashes([1, 2, 3], 4)) == 0


def test_chained_hashes_continue_from_a_given_parent():
    full = chained_block_hashes([1, 2, 3, 4, 5, 6], 2)
    assert chained_block_hashes([3, 4, 5, 6], 2, parent=full[0]) == full[1:]


# -- matching -------------------------------------------------------------------------------------
def test_empty_cache_matches_nothing():
    alloc, cache, events = make_cache()
    m = cache.match_prefix([1, 2, 3, 4])
    assert m.node is cache.root
    assert m.blocks == [] and m.num_blocks == 0
    assert events == []
    assert_accounting(alloc, cache)


def test_match_returns_whole_blocks_of_the_longest_cached_prefix():
    alloc, cache, _ = make_cache()
    assert store(alloc, cache, [1, 2, 3, 4, 5, 6]) == [0, 1, 2]
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).blocks == [0, 1, 2]
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).blocks == [0, 1, 2]
    assert cache.match_prefix([1, 2, 3, 4, 5]).blocks == [0, 1]  # the trailing 5 is not a whole block
    assert cache.match_prefix([1, 2, 3, 4, 5, 7]).blocks == [0, 1]
    assert cache.match_prefix([1, 2, 3, 9, 5, 6]).blocks == [0]  # a mismatch inside block 2 stops it
    assert cache.match_prefix([1, 2]).blocks == [0]
    assert cache.match_prefix([1]).blocks == []
    assert cache.match_prefix([2, 1, 3, 4]).blocks == []
    assert cache.match_prefix([]).blocks == []
    assert_accounting(alloc, cache)


def test_match_respects_max_blocks():
    alloc, cache, _ = make_cache()
    store(alloc, cache, [1, 2, 3, 4, 5, 6])
    tokens = [1, 2, 3, 4, 5, 6]
    assert cache.match_prefix(tokens, max_blocks=0).blocks == []
    assert cache.match_prefix(tokens, max_blocks=0).node is cache.root
    assert cache.match_prefix(tokens, max_blocks=1).blocks == [0]
    assert cache.match_prefix(tokens, max_blocks=2).blocks == [0, 1]
    assert cache.match_prefix(tokens, max_blocks=9).blocks == [0, 1, 2]


def test_match_node_is_the_deepest_matched_node():
    alloc, cache, _ = make_cache()
    store(alloc, cache, [1, 2, 3, 4])
    m = cache.match_prefix([1, 2, 3, 4, 9, 9])
    assert m.node.block == 1
    assert m.node.tokens == (3, 4)
    assert m.node.parent.block == 0
    assert m.node.parent.parent is cache.root
    assert m.node.hash == hashes_of([1, 2, 3, 4])[1]


def test_match_does_not_take_references_or_locks():
    alloc, cache, _ = make_cache()
    store(alloc, cache, [1, 2, 3, 4])
    m = cache.match_prefix([1, 2, 3, 4])
    assert [alloc.ref_count(b) for b in m.blocks] == [1, 1]
    assert cache.num_evictable_blocks == 2
    assert_accounting(alloc, cache)


# -- insertion ------------------------------------------------------------------------------------
def test_insert_stores_full_blocks_and_takes_one_ref_each():
    alloc, cache, _ = make_cache()
    blocks = alloc.allocate(2)  # a request's table: one full block, one partial
    node, canonical = cache.insert([1, 2, 3], blocks)
    assert canonical == [0]
    assert node.block == 0 and node.tokens == (1, 2)
    assert alloc.ref_count(0) == 2  # the request's and the tree's
    assert alloc.ref_count(1) == 1  # the partial block stays the request's alone
    assert cache.num_cached_blocks == 1 and cache.num_evictable_blocks == 1
    assert_accounting(alloc, cache, held=blocks)
    alloc.decref(blocks)
    assert cache.cached_blocks() == {0}
    assert alloc.num_free == 7
    assert_accounting(alloc, cache)


def test_insert_stops_at_the_last_given_block():
    alloc, cache, _ = make_cache()
    blocks = alloc.allocate(1)
    node, canonical = cache.insert([1, 2, 3, 4, 5, 6], blocks)
    assert canonical == [0]
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).blocks == [0]
    assert_accounting(alloc, cache, held=blocks)


def test_insert_of_nothing_returns_the_root():
    alloc, cache, events = make_cache()
    node, canonical = cache.insert([1], alloc.allocate(1))
    assert node is cache.root and canonical == []
    assert cache.num_cached_blocks == 0
    assert events == []


def test_second_insert_of_a_prefix_gets_the_first_ids_back_and_no_ref_on_duplicates():
    alloc, cache, events = make_cache()
    first = alloc.allocate(2)  # [0, 1]
    cache.insert([1, 2, 3, 4], first)
    second = alloc.allocate(3)  # [2, 3, 4]: same prefix computed again, plus one new block
    node, canonical = cache.insert([1, 2, 3, 4, 5, 6], second)
    assert canonical == [0, 1, 4]
    assert node.block == 4
    # The tree kept its own copies: no reference on the duplicates 2 and 3, one on the new block 4.
    assert [alloc.ref_count(b) for b in range(5)] == [2, 2, 1, 1, 2]
    assert cache.num_cached_blocks == 3
    assert_accounting(alloc, cache, held=first + second)
    # The second caller releases its duplicates; they go straight back to the pool.
    alloc.decref([2, 3])
    assert alloc.ref_count(2) == alloc.ref_count(3) == 0
    assert_accounting(alloc, cache, held=first + [4])
    # Only the new block was announced the second time.
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert [e.block_hashes for e in stored] == [tuple(hashes_of([1, 2, 3, 4])), (hashes_of([1, 2, 3, 4, 5, 6])[2],)]


def test_insert_of_an_already_cached_prefix_changes_nothing_and_emits_nothing():
    alloc, cache, events = make_cache()
    store(alloc, cache, [1, 2, 3, 4])
    n_events = len(events)
    again = alloc.allocate(2)
    node, canonical = cache.insert([1, 2, 3, 4], again)
    assert canonical == [0, 1]
    assert len(events) == n_events
    assert cache.num_cached_blocks == 2 and cache.num_evictable_blocks == 2
    assert_accounting(alloc, cache, held=again)


def test_branches_share_their_common_prefix():
    alloc, cache, _ = make_cache()
    assert store(alloc, cache, [1, 2, 3, 4]) == [0, 1]
    assert store(alloc, cache, [1, 2, 5, 6]) == [0, 3]  # block 2 was the duplicate of [1, 2]
    assert cache.num_cached_blocks == 3
    assert cache.cached_blocks() == {0, 1, 3}
    root_child = cache.root.children[(1, 2)]
    assert set(root_child.children) == {(3, 4), (5, 6)}
    assert_accounting(alloc, cache)


# -- locking --------------------------------------------------------------------------------------
def test_lock_counts_propagate_to_every_ancestor():
    alloc, cache, _ = make_cache()
    store(alloc, cache, [1, 2, 3, 4, 5, 6])
    a = cache.root.children[(1, 2)]
    b = a.children[(3, 4)]
    c = b.children[(5, 6)]
    assert cache.num_evictable_blocks == 3

    cache.lock(c)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (1, 1, 1)
    assert cache.num_evictable_blocks == 0
    cache.lock(b)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (2, 2, 1)
    assert cache.num_evictable_blocks == 0
    cache.unlock(c)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (1, 1, 0)
    assert cache.num_evictable_blocks == 1
    cache.unlock(b)
    assert (a.lock_ref, b.lock_ref, c.lock_ref) == (0, 0, 0)
    assert cache.num_evictable_blocks == 3
    assert cache.root.lock_ref == 1  # the root is pinned and never counted
    assert_accounting(alloc, cache)


def test_lock_and_unlock_of_the_root_are_no_ops():
    alloc, cache, _ = make_cache()
    store(alloc, cache, [1, 2])
    cache.lock(cache.root)
    cache.unlock(cache.root)
    assert cache.root.lock_ref == 1
    assert cache.num_evictable_blocks == 1


def test_unlock_of_an_unlocked_node_raises():
    alloc, cache, _ = make_cache()
    store(alloc, cache, [1, 2])
    node = cache.match_prefix([1, 2]).node
    with pytest.raises(AssertionError):
        cache.unlock(node)
    cache.lock(node)
    cache.unlock(node)
    with pytest.raises(AssertionError):
        cache.unlock(node)


def test_lock_does_not_change_references():
    alloc, cache, _ = make_cache()
    store(alloc, cache, [1, 2, 3, 4])
    cache.lock(cache.match_prefix([1, 2, 3, 4]).node)
    assert [alloc.ref_count(b) for b in (0, 1)] == [1, 1]
    assert alloc.num_free == 6
    assert_accounting(alloc, cache)


def test_new_child_under_a_locked_node_is_evictable():
    alloc, cache, _ = make_cache()
    store(alloc, cache, [1, 2])
    cache.lock(cache.match_prefix([1, 2]).node)
    assert cache.num_evictable_blocks == 0
    store(alloc, cache, [1, 2, 3, 4])
    assert cache.num_cached_blocks == 2
    assert cache.num_evictable_blocks == 1
    assert cache.evict(5) == 1
    assert cache.cached_blocks() == {0}
    assert_accounting(alloc, cache)


# -- eviction -------------------------------------------------------------------------------------
def test_evict_takes_least_recently_used_leaf_first():
    alloc, cache, events = make_cache()
    x, y, z = [1, 2], [3, 4], [5, 6]
    assert store(alloc, cache, x) == [0]
    assert store(alloc, cache, y) == [1]
    assert store(alloc, cache, z) == [2]
    cache.match_prefix(x)  # x is now the most recently used
    assert cache.evict(1) == 1
    assert cache.cached_blocks() == {0, 2}
    assert cache.evict(1) == 1
    assert cache.cached_blocks() == {0}
    assert cache.evict(1) == 1
    assert cache.cached_blocks() == set()
    assert evicted_hashes(events) == [hashes_of(y)[0], hashes_of(z)[0], hashes_of(x)[0]]
    # Evicted blocks go back to the free list in eviction order, behind the never-used ones.
    assert alloc.allocate(8) == [3, 4, 5, 6, 7, 1, 2, 0]


def test_insert_refreshes_recency_of_the_whole_path():
    alloc, cache, events = make_cache()
    store(alloc, cache, [1, 2, 3, 4])
    store(alloc, cache, [5, 6])
    store(alloc, cache, [1, 2, 3, 4])  # touches [1,2] and [3,4] again
    assert cache.evict(1) == 1
    assert evicted_hashes(events) == [hashes_of([5, 6])[0]]


def test_match_refreshes_only_the_matched_nodes():
    alloc, cache, events = make_cache()
    store(alloc, cache, [1, 2, 3, 4])
    store(alloc, cache, [5, 6])
    cache.match_prefix([1, 2, 3, 4], max_blocks=1)  # touches [1,2], not the leaf [3,4]
    assert cache.evict(1) == 1
    assert evicted_hashes(events) == [hashes_of([1, 2, 3, 4])[1]]


def test_parent_becomes_evictable_after_its_children_go():
    alloc, cache, events = make_cache()
    assert store(alloc, cache, [1, 2, 3, 4]) == [0, 1]  # a -> b, clock 1
    assert store(alloc, cache, [5, 6]) == [2]  # c, clock 2
    assert store(alloc, cache, [1, 2, 7, 8]) == [0, 4]  # a -> d, clock 3 (block 3 was the duplicate)
    a, b, c, d = (hashes_of([1, 2, 3, 4])[0], hashes_of([1, 2, 3, 4])[1],
                  hashes_of([5, 6])[0], hashes_of([1, 2, 7, 8])[1])
    # Leaves by age: b (1), c (2), d (3). a still has d, so it waits.
    assert cache.evict(2) == 2
    assert evicted_hashes(events) == [b, c]
    assert cache.cached_blocks() == {0, 4}
    assert cache.num_evictable_blocks == 2
    # d goes, then a (now a leaf, last used at clock 3) in the same call.
    assert cache.evict(2) == 2
    assert evicted_hashes(events) == [b, c, d, a]
    assert cache.num_cached_blocks == 0 and cache.num_evictable_blocks == 0
    assert alloc.num_free == 8
    assert_accounting(alloc, cache)


def test_a_freed_parent_competes_by_its_own_last_access():
    alloc, cache, events = make_cache()
    store(alloc, cache, [1, 2, 3, 4])  # a -> b at clock 1
    store(alloc, cache, [5, 6])  # c at clock 2
    # One call, three blocks: b (1), then a (clock 1, older than c), then c.
    assert cache.evict(3) == 3
    assert evicted_hashes(events) == [hashes_of([1, 2, 3, 4])[1], hashes_of([1, 2, 3, 4])[0], hashes_of([5, 6])[0]]
    assert len([e for e in events if isinstance(e, BlockRemoved)]) == 1  # one event for the batch


def test_equal_last_access_is_broken_by_creation_order():
    alloc, cache, events = make_cache()
    store(alloc, cache, [5, 6])  # created first
    store(alloc, cache, [1, 2])
    store(alloc, cache, [3, 4])
    # One insert or match touches a single path, so two leaves only tie when set to; the contract
    # (ties by creation order) is what keeps eviction deterministic.
    for x in nodes(cache):
        x.last_access = 7
    assert cache.evict(3) == 3
    assert evicted_hashes(events) == [hashes_of([5, 6])[0], hashes_of([1, 2])[0], hashes_of([3, 4])[0]]


def test_evict_stops_at_the_requested_count():
    alloc, cache, events = make_cache()
    store(alloc, cache, [1, 2, 3, 4, 5, 6])
    assert cache.evict(0) == 0
    assert cache.evict(1) == 1
    assert cache.cached_blocks() == {0, 1}
    assert cache.num_evicted_blocks == 1
    assert cache.evict(10) == 2
    assert cache.num_evicted_blocks == 3
    assert cache.evict(10) == 0
    assert sum(isinstance(e, BlockRemoved) for e in events) == 2  # empty evictions emit nothing


def test_locked_nodes_are_never_evicted():
    alloc, cache, events = make_cache()
    store(alloc, cache, [1, 2, 3, 4])  # a -> b
    store(alloc, cache, [5, 6])  # c
    store(alloc, cache, [1, 2, 7, 8])  # a -> d
    cache.lock(cache.match_prefix([1, 2, 3, 4]).node)  # locks b and a
    assert cache.num_evictable_blocks == 2  # c, d
    assert cache.evict(10) == 2
    assert cache.cached_blocks() == {0, 1}
    assert cache.num_evictable_blocks == 0
    assert cache.evict(10) == 0
    assert_accounting(alloc, cache)


def test_locked_interior_node_is_kept_when_its_unlocked_child_goes():
    alloc, cache, _ = make_cache()
    store(alloc, cache, [1, 2, 3, 4])
    parent = cache.match_prefix([1, 2]).node
    cache.lock(parent)
    assert cache.num_evictable_blocks == 1
    assert cache.evict(10) == 1
    assert cache.cached_blocks() == {0}
    cache.unlock(parent)
    assert cache.evict(10) == 1
    assert cache.cached_blocks() == set()
    assert_accounting(alloc, cache)


def test_evicting_a_block_a_request_still_holds_does_not_free_it():
    alloc, cache, _ = make_cache()
    held = alloc.allocate(1)
    cache.insert([1, 2], held)  # a caller that did not lock its node
    assert cache.evict(1) == 1
    assert alloc.ref_count(held[0]) == 1
    assert_accounting(alloc, cache, held=held)


# -- reset ----------------------------------------------------------------------------------------
def test_reset_refuses_while_locked():
    alloc, cache, events = make_cache()
    store(alloc, cache, [1, 2, 3, 4])
    node = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(node)
    n_events = len(events)
    with pytest.raises(RuntimeError):
        cache.reset()
    assert cache.num_cached_blocks == 2
    assert len(events) == n_events
    assert_accounting(alloc, cache)
    cache.unlock(node)
    cache.reset()
    assert cache.num_cached_blocks == 0 and cache.num_evictable_blocks == 0
    assert cache.match_prefix([1, 2, 3, 4]).blocks == []
    assert alloc.num_free == 8
    assert_accounting(alloc, cache)


def test_reset_drops_only_the_tree_references():
    alloc, cache, events = make_cache()
    store(alloc, cache, [1, 2, 3, 4])
    held = alloc.allocate(1)
    cache.insert([5, 6], held)
    cache.reset()
    assert alloc.ref_count(held[0]) == 1
    assert alloc.num_free == 7
    assert isinstance(events[-1], AllBlocksCleared)
    assert_accounting(alloc, cache, held=held)
    # The cache is usable again and ids keep coming from the FIFO free list.
    assert store(alloc, cache, [1, 2]) == [3]


# -- events ---------------------------------------------------------------------------------------
def test_event_stream_contents_and_sequence():
    alloc, cache, events = make_cache()
    h = hashes_of([1, 2, 3, 4, 5, 6])

    store(alloc, cache, [1, 2, 3, 4, 5])  # two full blocks, the 5 is dropped
    store(alloc, cache, [1, 2, 3, 4, 5, 6])  # extends the path by one block
    store(alloc, cache, [1, 2, 3, 4])  # nothing new: no event
    store(alloc, cache, [9, 9])
    cache.evict(2)
    cache.reset()

    h99 = hashes_of([9, 9])[0]
    assert events == [
        BlockStored(seq=1, parent_hash=ROOT_HASH, block_hashes=(h[0], h[1]), token_ids=(1, 2, 3, 4), block_size=2),
        BlockStored(seq=2, parent_hash=h[1], block_hashes=(h[2],), token_ids=(5, 6), block_size=2),
        BlockStored(seq=3, parent_hash=ROOT_HASH, block_hashes=(h99,), token_ids=(9, 9), block_size=2),
        BlockRemoved(seq=4, block_hashes=(h[2], h[1])),  # [9,9] was used after [1..6], so it stays
        AllBlocksCleared(seq=5),
    ]


def test_event_sequence_numbers_increase_by_one():
    alloc, cache, events = make_cache(num_blocks=16)
    for tokens in ([1, 2], [1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4, 9, 9]):
        store(alloc, cache, tokens)
        cache.evict(1)
    cache.reset()
    store(alloc, cache, [1, 2])
    cache.evict(1)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(events) == 11


def test_event_hashes_are_the_chained_block_hashes_of_the_tokens():
    alloc, cache, events = make_cache(num_blocks=16, block_size=3)
    prompts = ([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 8, 8, 8, 9, 9, 9], [4, 5, 6])
    for tokens in prompts:
        store(alloc, cache, tokens)
    # Replaying the events from an empty table reconstructs exactly chained_block_hashes.
    known = {ROOT_HASH}
    for e in events:
        assert e.parent_hash in known
        assert len(e.token_ids) == len(e.block_hashes) * e.block_size == len(e.block_hashes) * 3
        assert list(e.block_hashes) == chained_block_hashes(e.token_ids, 3, parent=e.parent_hash)
        known.update(e.block_hashes)
    for tokens in prompts:
        expected = chained_block_hashes(tokens, 3)
        assert set(expected) <= known
        node = cache.match_prefix(tokens).node
        path = []
        while node is not cache.root:
            path.append(node.hash)
            node = node.parent
        assert path[::-1] == expected
    cache.evict(100)
    removed = evicted_hashes(events)
    assert sorted(removed) == sorted(known - {ROOT_HASH})


def test_cache_without_a_callback_still_works():
    alloc = BlockAllocator(4)
    cache = RadixCache(alloc, 2)
    store(alloc, cache, [1, 2, 3, 4])
    assert cache.evict(1) == 1
    cache.reset()
    assert alloc.num_free == 4


def test_snapshot_lists_every_cached_block_parents_first():
    from raypd.protocol.block_hash import chained_block_hashes

    alloc = BlockAllocator(16)
    events = []
    cache = RadixCache(alloc, 4, events.append)
    a, b = list(range(12)), list(range(8)) + [50, 51, 52, 53]
    cache.insert(a, alloc.allocate(3))
    cache.insert(b, alloc.allocate(3))
    seq, snap = cache.snapshot()
    assert seq == events[-1].seq
    hashes = [e.block_hashes[0] for e in snap]
    assert set(hashes) == set(chained_block_hashes(a, 4)) | set(chained_block_hashes(b, 4))
    seen = {0}
    for e in snap:  # every parent is listed before its children
        assert e.parent_hash in seen
        seen.add(e.block_hashes[0])
