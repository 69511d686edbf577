"""KVSender and KVReceiver in one process over the fake backend: the room protocol and its failure
paths, with real ZMQ bootstrap sockets on 127.0.0.1. Every wait has a timeout; none asserts speed."""
from __future__ import annotations

import dataclasses
import logging
import time

import pytest
import torch

from raypd.kvtransfer import (
    BackendUnavailableError,
    BlockIdError,
    KVReceiver,
    KVSender,
    RoomError,
    TransferConfig,
    create_backend,
)
from raypd.kvtransfer import TransferState as S
from tests.conftest import keyed

CFG = TransferConfig(backend="fake", bootstrap_timeout_s=0.6, wait_timeout_s=5.0, transfer_timeout_s=0.8,
                     heartbeat_interval_s=0.1, heartbeat_timeout_s=1.0)
W = 10.0  # generous bound on any wait



def pools(seed: int, blocks: int = 16, slots: int = 4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(blocks, 2, 2, 4, 2, 8, generator=g), torch.randint(0, 1 << 30, (slots, 4), generator=g)


@pytest.fixture
def pair():
    snd = KVSender(*pools(1), CFG)
    rcv = KVReceiver(*pools(2), CFG)
    try:
        yield snd, rcv
    finally:
        rcv.close()
        snd.close()


def handshake(snd, rcv, room, dst, aux=0):
    snd.add_room(room)
    rcv.add_room(room, snd.bootstrap_address, dst, aux)
    assert snd.wait(room, S.WAITING_FOR_INPUT, W) == S.WAITING_FOR_INPUT


def assert_clean(*eps):
    for ep in eps:
        st = ep.stats()
        assert (st.rooms, st.live_rooms, st.held_blocks) == (0, 0, 0), (ep.name, st)


def test_an_endpoint_without_rooms_polls_at_the_quiet_period(pair):
    """With no room open only heartbeats are due, so the loop sleeps longest; an open room brings
    back the idle period (its deadlines and notifications), bytes in motion the busy one."""
    snd, rcv = pair
    for ep in pair:
        assert ep._next_wait(False) == CFG.quiet_poll_s > CFG.idle_poll_s
        assert ep._next_wait(True) == CFG.busy_poll_s
    handshake(snd, rcv, 3, [1, 2])
    assert snd._next_wait(False) == rcv._next_wait(False) == CFG.idle_poll_s
    rcv.abort(3)
    assert rcv.wait(3, S.SUCCESS, W) == S.FAILED and snd.wait(3, S.SUCCESS, W) == S.FAILED
    rcv.release(3)
    snd.release(3)
    assert snd._next_wait(False) == rcv._next_wait(False) == CFG.quiet_poll_s
    assert_clean(snd, rcv)


def test_blocks_and_aux_arrive_and_nothing_else_moves(pair):
    snd, rcv = pair
    before = rcv.backend.pool.clone(), rcv.backend.aux.clone()
    handshake(snd, rcv, 5, [9, 3, 4], aux=2)
    assert snd.destination(5)[0].tolist() == [9, 3, 4]
    snd.send(5, [0, 1, 7], src_aux=3)
    assert rcv.wait(5, S.SUCCESS, W) == S.SUCCESS
    assert snd.wait(5, S.SUCCESS, W) == S.SUCCESS
    pool, aux = rcv.backend.pool, rcv.backend.aux
    assert torch.equal(pool[[9, 3, 4]], snd.backend.pool[[0, 1, 7]])
    assert torch.equal(aux[2], snd.backend.aux[3])
    untouched = [b for b in range(16) if b not in (9, 3, 4)]
    assert torch.equal(pool[untouched], before[0][untouched])
    assert torch.equal(aux[[0, 1, 3]], before[1][[0, 1, 3]])
    rec = snd.release(5)
    assert rec.t_posted is not None and rec.t_landed is not None and rec.nbytes == 3 * pool[0].numel() * 4
    rcv.release(5)
    assert_clean(snd, rcv)


def test_send_before_the_destination_is_posted_when_it_arrives(pair):
    snd, rcv = pair
    snd.add_room(21)
    snd.send(21, [3, 4], src_aux=1)  # prefill finished before decode reserved its blocks
    assert snd.poll(21) == S.BOOTSTRAPPING
    rcv.add_room(21, snd.bootstrap_address, [7, 8], 0)
    assert rcv.wait(21, S.SUCCESS, W) == S.SUCCESS and snd.wait(21, S.SUCCESS, W) == S.SUCCESS
    assert torch.equal(rcv.backend.pool[[7, 8]], snd.backend.pool[[3, 4]])
    snd.add_room(22)
    snd.send(22, [3, 4])
    rcv.add_room(22, snd.bootstrap_address, [9], 0)  # one block reserved for two: refused on both sides
    assert snd.wait(22, S.SUCCESS, W) == S.FAILED and rcv.wait(22, S.SUCCESS, W) == S.FAILED
    assert "does not fit" in rcv.failure_reason(22)


def test_destination_before_add_room_waits_as_orphan(pair):
    snd, rcv = pair
    rcv.add_room(8, snd.bootstrap_address, [1], None)
    assert rcv.wait(8, S.WAITING_FOR_INPUT, W) == S.WAITING_FOR_INPUT
    snd.add_room(8)
    assert snd.wait(8, S.WAITING_FOR_INPUT, W) == S.WAITING_FOR_INPUT
    snd.send(8, [2])
    assert rcv.wait(8, S.SUCCESS, W) == S.SUCCESS and snd.wait(8, S.SUCCESS, W) == S.SUCCESS


def test_orphan_destination_expires_and_receiver_frees(pair):
    snd, rcv = pair
    rcv.add_room(9, snd.bootstrap_address, [1, 2], 0)
    assert rcv.wait(9, S.SUCCESS, W) == S.FAILED
    assert "no request for this room" in rcv.failure_reason(9)
    rcv.release(9)
    assert_clean(snd, rcv)


def test_bootstrap_timeout_on_sender(pair):
    snd, _ = pair
    snd.add_room(1)
    assert snd.wait(1, S.SUCCESS, W) == S.FAILED
    assert "bootstrap timeout" in snd.failure_reason(1)
    snd.release(1)
    assert_clean(snd)


def test_receiver_abort_before_send_fails_both_sides(pair):
    snd, rcv = pair
    handshake(snd, rcv, 2, [4, 5])
    rcv.abort(2, "client went away")
    assert rcv.wait(2, S.SUCCESS, W) == S.FAILED
    assert snd.wait(2, S.SUCCESS, W) == S.FAILED
    assert "client went away" in snd.failure_reason(2)
    snd.send(2, [0, 1])  # too late: a no-op, the room stays FAILED
    assert snd.poll(2) == S.FAILED
    snd.release(2), rcv.release(2)
    assert_clean(snd, rcv)


def test_sender_abort_reaches_receiver(pair):
    snd, rcv = pair
    handshake(snd, rcv, 3, [4])
    snd.abort(3, "prefill failed")
    assert snd.wait(3, S.SUCCESS, W) == S.FAILED
    assert rcv.wait(3, S.SUCCESS, W) == S.FAILED
    assert "prefill failed" in rcv.failure_reason(3)


def test_receiver_abort_during_a_held_write_waits_for_it_when_writes_cannot_be_refused(pair):
    snd, rcv = pair
    rcv.backend.revocable = False  # as nixl's one-sided writes: the receiver cannot refuse them
    handshake(snd, rcv, 4, [6, 7])
    snd.backend.hold_writes = True
    snd.send(4, [1, 2])
    assert rcv.wait(4, S.TRANSFERRING, W) == S.TRANSFERRING
    rcv.abort(4)
    # The sender cannot confirm while its write may still land, so neither side is final yet.
    assert rcv.wait(4, S.SUCCESS, 0.3) == S.TRANSFERRING
    assert snd.poll(4) == S.TRANSFERRING
    snd.backend.complete_held()  # the fake's bytes land now (from this thread: fine for the fake)
    assert snd.wait(4, S.SUCCESS, W) == S.FAILED
    assert rcv.wait(4, S.SUCCESS, W) == S.FAILED  # the late notification was not taken as success


def test_a_write_held_past_the_heartbeat_timeout_cannot_land_in_reused_blocks(pair):
    """The write-after-free bug: the receiver gives a room up, its blocks go to another request, and
    the first room's write lands late. With a revocable backend the abort is final at once and the
    late write is refused: the blocks keep the second request's bytes."""
    snd, rcv = pair
    handshake(snd, rcv, 4, [6, 7])
    snd.backend.hold_writes = snd.backend.unrecallable_writes = True  # even cancelling cannot stop it
    snd.send(4, [1, 2])
    assert rcv.wait(4, S.TRANSFERRING, W) == S.TRANSFERRING
    rcv.abort(4, "client went away")
    assert rcv.wait(4, S.SUCCESS, W) == S.FAILED  # final without the sender: the window is closed
    rcv.release(4)
    time.sleep(CFG.heartbeat_timeout_s * 1.5)  # hold the write well past the heartbeat timeout
    # The blocks now belong to another request, written by its own room.
    snd.backend.hold_writes = False
    handshake(snd, rcv, 5, [6, 7])
    snd.send(5, [3, 4])
    assert rcv.wait(5, S.SUCCESS, W) == S.SUCCESS
    second = rcv.backend.pool[[6, 7]].clone()
    assert torch.equal(second, snd.backend.pool[[3, 4]])
    assert snd.backend.complete_held() == 1  # the first room's write arrives now
    assert rcv.backend.num_refused == 1
    assert torch.equal(rcv.backend.pool[[6, 7]], second)  # untouched
    assert snd.wait(4, S.SUCCESS, W) == S.FAILED
    assert snd.wait(5, S.SUCCESS, W) == S.SUCCESS
    for room in (4, 5):
        snd.release(room)
    rcv.release(5)
    assert_clean(snd, rcv)


def test_failed_write_fails_both_sides(pair):
    snd, rcv = pair
    handshake(snd, rcv, 6, [1])
    snd.backend.fail_writes = True
    snd.send(6, [1])
    assert snd.wait(6, S.SUCCESS, W) == S.FAILED and "write failed" in snd.failure_reason(6)
    assert rcv.wait(6, S.SUCCESS, W) == S.FAILED


def test_lost_notification_ends_in_transfer_timeout(pair):
    snd, rcv = pair
    handshake(snd, rcv, 7, [1])
    rcv.backend.drop_notifications = True
    snd.send(7, [1])
    assert snd.wait(7, S.SUCCESS, W) == S.FAILED
    assert rcv.wait(7, S.SUCCESS, W) == S.FAILED
    assert "timeout" in snd.failure_reason(7) or "timeout" in rcv.failure_reason(7)
    snd.release(7), rcv.release(7)
    assert_clean(snd, rcv)


def test_sender_closing_fails_receiver_rooms(pair):
    snd, rcv = pair
    handshake(snd, rcv, 11, [1])
    snd.close()
    assert rcv.wait(11, S.SUCCESS, W) == S.FAILED


@pytest.mark.parametrize("woken", ["sender", "receiver"])
def test_an_endpoint_waking_from_a_pause_keeps_its_peers(woken):
    """A stopped or starved process must not call its peers dead for the silence it caused itself."""
    patient = dataclasses.replace(CFG, bootstrap_timeout_s=30.0, wait_timeout_s=30.0, transfer_timeout_s=30.0)
    with KVSender(*pools(1), patient) as snd, KVReceiver(*pools(2), patient) as rcv:
        handshake(snd, rcv, 1, [4])
        ep = snd if woken == "sender" else rcv
        ep.rooms.clock = lambda: time.monotonic() + 3.0  # its clock moved 3 s (3 heartbeat timeouts) at once
        time.sleep(0.5)  # several heartbeat checks after the wake-up
        assert snd.poll(1) == rcv.poll(1) == S.WAITING_FOR_INPUT
        assert snd.stats().peers == rcv.stats().peers == 1
        snd.send(1, [2])
        assert rcv.wait(1, S.SUCCESS, W) == S.SUCCESS and snd.wait(1, S.SUCCESS, W) == S.SUCCESS


def test_unreachable_sender_fails_after_bootstrap_timeout():
    import socket
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with KVReceiver(*pools(3), CFG) as rcv:
        rcv.add_room(1, keyed(f"tcp://127.0.0.1:{port}"), [1], None)
        assert rcv.wait(1, S.SUCCESS, W) == S.FAILED
        assert "timeout" in rcv.failure_reason(1)  # bootstrap or heartbeat, whichever fires first
        rcv.release(1)
        assert_clean(rcv)


def test_layout_mismatch_is_refused_at_registration(caplog):
    with KVSender(*pools(1), CFG) as snd, KVReceiver(torch.zeros(8, 3), torch.zeros(2, 4, dtype=torch.int64), CFG) as rcv:
        snd.add_room(1)
        with caplog.at_level(logging.ERROR, logger="kvtransfer"):
            rcv.add_room(1, snd.bootstrap_address, [1], None)
            assert rcv.wait(1, S.SUCCESS, W) == S.FAILED
        assert "registration refused" in rcv.failure_reason(1)
        assert any("layout mismatch" in r.getMessage() for r in caplog.records)


def test_caller_errors_are_typed(pair):
    snd, rcv = pair
    with pytest.raises(BlockIdError):
        rcv.add_room(1, snd.bootstrap_address, [99], None)
    with pytest.raises(BlockIdError):
        rcv.add_room(1, snd.bootstrap_address, [1, 1], None)
    with pytest.raises(RoomError):
        snd.poll(12345)
    snd.add_room(1)
    snd.send(1, [1])  # armed: posted when the destination arrives
    with pytest.raises(RoomError, match="WAITING_FOR_INPUT"):
        snd.send(1, [1])  # but only once
    with pytest.raises(RoomError, match="already in use"):
        snd.add_room(1)
    with pytest.raises(BackendUnavailableError):
        create_backend(CFG.with_(backend="nope"), "x")
