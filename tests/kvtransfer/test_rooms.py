"""The room lifecycle rules, on a fake clock."""
from __future__ import annotations

import pytest

from raypd.kvtransfer.base import TransferState as S
from raypd.kvtransfer.base import XferId
from raypd.kvtransfer.errors import RoomError
from raypd.kvtransfer.rooms import RoomTable


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_states_are_ordered_so_min_is_the_slowest():
    parts = [S.SUCCESS, S.TRANSFERRING, S.WAITING_FOR_INPUT]
    assert min(parts) == S.WAITING_FOR_INPUT
    assert min(parts + [S.FAILED]) == S.FAILED
    assert [s.is_terminal for s in S] == [True, False, False, False, True]


def test_forward_only_and_failed_is_sticky():
    t = RoomTable(Clock())
    r = t.add(1, S.BOOTSTRAPPING, timeout=5)
    assert t.advance(r, S.TRANSFERRING)
    assert not t.advance(r, S.WAITING_FOR_INPUT)  # never backwards
    assert t.fail(r, "first reason")
    assert not t.advance(r, S.SUCCESS)
    assert not t.fail(r, "second reason")
    assert r.state == S.FAILED and r.reason == "first reason"


def test_success_is_final():
    t = RoomTable(Clock())
    r = t.add(1, S.WAITING_FOR_INPUT, timeout=5)
    assert t.advance(r, S.SUCCESS)
    assert not t.fail(r, "late abort")
    assert r.state == S.SUCCESS


def test_no_terminal_state_while_a_write_is_held():
    t = RoomTable(Clock())
    r = t.add(1, S.TRANSFERRING, timeout=5)
    r.xfer = XferId(7)
    with pytest.raises(AssertionError):
        t.fail(r, "x")
    with pytest.raises(AssertionError):
        t.advance(r, S.SUCCESS)
    r.xfer = None
    assert t.fail(r, "x")


def test_aborting_blocks_progress_until_failed():
    t = RoomTable(Clock())
    r = t.add(1, S.WAITING_FOR_INPUT, timeout=5)
    assert t.mark_aborting(r, "asked", timeout=2)
    assert not t.advance(r, S.SUCCESS)
    assert r.state == S.WAITING_FOR_INPUT
    assert t.fail(r, "ignored: first reason wins")
    assert r.reason == "asked" and not r.aborting


def test_deadlines_and_release():
    clock = Clock()
    t = RoomTable(clock)
    a = t.add(1, S.BOOTSTRAPPING, timeout=5)
    t.add(2, S.BOOTSTRAPPING, timeout=10)
    with pytest.raises(RoomError):
        t.add(1, S.BOOTSTRAPPING, timeout=5)
    clock.t += 6
    assert [r.room for r in t.expired()] == [1]
    with pytest.raises(RoomError, match="abort it"):
        t.release(1)
    t.fail(a, "timeout")
    assert t.expired() == []  # terminal rooms have no deadline
    assert t.release(1).reason == "timeout"
    assert len(t) == 1 and t.snapshot() == {2: S.BOOTSTRAPPING}
    with pytest.raises(RoomError):
        t.release(1)


def test_wait_returns_on_terminal_or_timeout():
    t = RoomTable()
    r = t.add(1, S.WAITING_FOR_INPUT, timeout=5)
    assert t.wait(1, S.SUCCESS, timeout=0.01) == S.WAITING_FOR_INPUT
    t.fail(r, "x")
    assert t.wait(1, S.SUCCESS, timeout=5) == S.FAILED
