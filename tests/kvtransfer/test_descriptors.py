"""Run coalescing and block-id checks (ints only)."""
from __future__ import annotations

import numpy as np
import pytest

from raypd.kvtransfer.descriptors import as_block_ids, check_pairs, check_slot, coalesce_runs
from raypd.kvtransfer.errors import BlockIdError


def runs_of(src, dst):
    r = coalesce_runs(np.array(src), np.array(dst))
    return list(zip(r.src_start.tolist(), r.dst_start.tolist(), r.length.tolist()))


def test_adjacent_on_both_sides_is_one_run():
    assert runs_of(range(10, 20), range(0, 10)) == [(10, 0, 10)]


def test_runs_break_where_either_side_jumps():
    assert runs_of([7, 8, 9, 2, 3], [0, 1, 2, 5, 6]) == [(7, 0, 3), (2, 5, 2)]
    assert runs_of([1, 2, 3], [4, 6, 7]) == [(1, 4, 1), (2, 6, 2)]


def test_pairs_are_ordered_by_destination_before_merging():
    # Given out of order, the same pairs still form one run.
    assert runs_of([12, 10, 11], [2, 0, 1]) == [(10, 0, 3)]


def test_scattered_blocks_stay_separate_and_empty_is_empty():
    assert runs_of([5, 1, 9], [0, 2, 4]) == [(5, 0, 1), (1, 2, 1), (9, 4, 1)]
    assert runs_of([], []) == []


def test_run_count_matches_brute_force_on_random_tables():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(1, 40))
        src = rng.choice(64, n, replace=False)
        dst = rng.choice(64, n, replace=False)
        pairs = sorted(zip(dst.tolist(), src.tolist()))
        expect = 1 + sum(1 for (d0, s0), (d1, s1) in zip(pairs, pairs[1:]) if not (d1 == d0 + 1 and s1 == s0 + 1))
        r = coalesce_runs(src, dst)
        assert len(r) == expect and int(r.length.sum()) == n


def test_block_id_validation():
    assert as_block_ids([0, 3], 4, "b").tolist() == [0, 3]
    with pytest.raises(BlockIdError):
        as_block_ids([4], 4, "b")
    with pytest.raises(BlockIdError):
        as_block_ids([-1], 4, "b")
    with pytest.raises(BlockIdError):
        as_block_ids([1.5], 4, "b")
    with pytest.raises(BlockIdError, match="repeat"):
        check_pairs(np.array([1, 2]), np.array([3, 3]))
    with pytest.raises(BlockIdError, match="source blocks"):
        check_pairs(np.array([1]), np.array([3, 4]))
    check_slot(None, 2, "aux")
    with pytest.raises(BlockIdError):
        check_slot(2, 2, "aux")
