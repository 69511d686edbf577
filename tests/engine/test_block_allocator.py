"""BlockAllocator: exact block ids (FIFO free list), reference counts, and misuse that must raise."""
from __future__ import annotations

import pytest

from raypd.engine.cache.block_allocator import BlockAllocator, OutOfBlocksError


def refcounts(alloc: BlockAllocator) -> list[int]:
    return [alloc.ref_count(b) for b in range(alloc.num_blocks)]


def assert_free_list_matches_refcounts(alloc: BlockAllocator) -> None:
    assert alloc.num_free == refcounts(alloc).count(0)


def test_fresh_pool_is_all_free():
    alloc = BlockAllocator(4)
    assert alloc.num_blocks == 4
    assert alloc.num_free == 4
    assert refcounts(alloc) == [0, 0, 0, 0]


@pytest.mark.parametrize("n", [0, -1])
def test_pool_needs_at_least_one_block(n):
    with pytest.raises(ValueError):
        BlockAllocator(n)


def test_allocate_hands_out_lowest_ids_first_with_refcount_one():
    alloc = BlockAllocator(5)
    assert alloc.allocate(2) == [0, 1]
    assert alloc.allocate(1) == [2]
    assert refcounts(alloc) == [1, 1, 1, 0, 0]
    assert alloc.num_free == 2


def test_allocate_zero_is_a_no_op():
    alloc = BlockAllocator(3)
    assert alloc.allocate(0) == []
    assert alloc.num_free == 3


def test_freed_blocks_are_reused_in_fifo_order():
    alloc = BlockAllocator(5)
    assert alloc.allocate(5) == [0, 1, 2, 3, 4]
    alloc.decref([3])
    alloc.decref([1])
    alloc.decref([4])
    # Freed blocks queue up behind each other in the order they were freed.
    assert alloc.allocate(1) == [3]
    assert alloc.allocate(2) == [1, 4]
    assert alloc.num_free == 0


def test_freed_block_goes_behind_never_used_blocks():
    alloc = BlockAllocator(4)
    assert alloc.allocate(2) == [0, 1]
    alloc.decref([0])
    assert alloc.allocate(3) == [2, 3, 0]


def test_incref_and_decref_count_references():
    alloc = BlockAllocator(3)
    a, b = alloc.allocate(2)
    alloc.incref([a, a, b])
    assert refcounts(alloc) == [3, 2, 0]
    alloc.decref([a, b])
    assert refcounts(alloc) == [2, 1, 0]
    assert alloc.num_free == 1
    alloc.decref([b])  # last reference: b goes back to the free list
    assert refcounts(alloc) == [2, 0, 0]
    assert alloc.num_free == 2
    alloc.decref([a, a])
    assert refcounts(alloc) == [0, 0, 0]
    assert alloc.num_free == 3
    assert alloc.allocate(3) == [2, 1, 0]  # 2 was never used, then 1 and 0 in the order freed


def test_double_free_raises():
    alloc = BlockAllocator(2)
    (b,) = alloc.allocate(1)
    alloc.decref([b])
    with pytest.raises(AssertionError, match="double free of block 0"):
        alloc.decref([b])
    assert alloc.num_free == 2
    assert_free_list_matches_refcounts(alloc)


def test_decref_of_never_allocated_block_raises():
    alloc = BlockAllocator(2)
    with pytest.raises(AssertionError):
        alloc.decref([1])
    assert alloc.num_free == 2


def test_incref_of_free_block_raises():
    alloc = BlockAllocator(2)
    with pytest.raises(AssertionError, match="incref of free block 1"):
        alloc.incref([1])
    assert refcounts(alloc) == [0, 0]
    assert alloc.num_free == 2


def test_out_of_blocks_raises_and_allocates_nothing():
    alloc = BlockAllocator(3)
    assert alloc.allocate(2) == [0, 1]
    with pytest.raises(OutOfBlocksError):
        alloc.allocate(2)
    # The failed call took nothing: the one free block is still there and still next.
    assert alloc.num_free == 1
    assert refcounts(alloc) == [1, 1, 0]
    assert alloc.allocate(1) == [2]
    with pytest.raises(OutOfBlocksError):
        alloc.allocate(1)


def test_out_of_blocks_is_a_runtime_error():
    assert issubclass(OutOfBlocksError, RuntimeError)
    with pytest.raises(RuntimeError):
        BlockAllocator(1).allocate(2)


def test_many_rounds_keep_free_list_and_refcounts_consistent():
    alloc = BlockAllocator(4)
    held: list[int] = []
    for _ in range(6):
        held += alloc.allocate(alloc.num_free)
        alloc.incref(held[:2])
        alloc.decref(held[:2])
        release, held = held[:3], held[3:]
        alloc.decref(release)
        assert alloc.num_free == 3
        assert_free_list_matches_refcounts(alloc)
    alloc.decref(held)
    assert alloc.num_free == 4
    assert refcounts(alloc) == [0, 0, 0, 0]
