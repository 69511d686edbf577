"""Two real processes, the real backends (NIXL over UCX, and tcp): bytes arrive exactly, failures end
in FAILED on both sides with nothing left behind. The parent is one endpoint, a spawned child the
other; every child is stopped by pid in a finally, every cross-process wait has a timeout."""
from __future__ import annotations

import logging
import time

import msgpack
import numpy as np
import pytest
import zmq

from raypd.kvtransfer import KVReceiver, KVSender, TransferConfig
from raypd.kvtransfer import TransferState as S
from raypd.kvtransfer.bootstrap import schema
from raypd.kvtransfer.data_plane_auth import DataPlaneSecret, as_client
from raypd.kvtransfer.identity import split_address
from tests.conftest import keyed
from tests.kvtransfer.peer_proc import Peer, make_pool, rand_tables

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

W = 20.0
SEND_BLOCKS, SEND_SLOTS = 128, 16
RECV_BLOCKS, RECV_SLOTS = 512, 96



# Both processes' endpoints get this one (pickled to the child), as a deployment hands out its secret.
SECRET = DataPlaneSecret.generate()


def config(backend: str, **kw) -> dict:
    # Short enough to keep the suite quick, long enough for a loaded 2-core machine.
    return dict(backend=backend, bootstrap_timeout_s=3.0, wait_timeout_s=30.0,
                transfer_timeout_s=10.0, heartbeat_interval_s=0.25, heartbeat_timeout_s=3.0,
                identity=SECRET.shared_identity()) | kw


@pytest.fixture(scope="module", params=["nixl", "tcp"])
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def receiver(backend):
    peer = Peer.start("receiver", config(backend), seed=2, num_blocks=RECV_BLOCKS, aux_slots=RECV_SLOTS)
    try:
        yield peer
    finally:
        peer.stop()


def make_sender(backend: str, seed: int = 1, **kw) -> tuple[KVSender, object, object]:
    pool, aux = make_pool(seed, SEND_BLOCKS, SEND_SLOTS)
    return KVSender(pool, aux, TransferConfig(**config(backend, **kw))), pool.numpy(), aux.numpy()


def room_ids(rng: np.random.Generator, n: int) -> list[int]:
    return [int(x) for x in rng.choice(1 << 62, n, replace=False)]


def assert_child_clean(peer: Peer) -> None:
    rooms, live, held, _ = peer.call("stats")
    assert (rooms, live, held) == (0, 0, 0)


def bytes_of(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


def test_random_tables_arrive_byte_exact_64_rooms_in_flight(backend, receiver):
    rng = np.random.default_rng(7)
    tables = rand_tables(rng, 64, SEND_BLOCKS, RECV_BLOCKS, max_len=6)
    rooms = room_ids(rng, 64)
    src_aux, dst_aux = rng.integers(0, SEND_SLOTS, 64).tolist(), rng.permutation(RECV_SLOTS)[:64].tolist()
    pool0, aux0 = receiver.call("pool")
    snd, spool, saux = make_sender(backend)
    try:
        for r in rooms[::2]:  # half the rooms exist here first, the others' destinations arrive first
            snd.add_room(r)
        receiver.call("many", [("add_room", (r, snd.bootstrap_address, dst, a))
                               for r, (_, dst), a in zip(rooms, tables, dst_aux)])
        for r in rooms[1::2]:
            snd.add_room(r)
        assert [snd.wait(r, S.WAITING_FOR_INPUT, W) for r in rooms] == [S.WAITING_FOR_INPUT] * 64
        for r, (src, _), a in zip(rooms, tables, src_aux):  # all 64 in flight at once
            snd.send(r, src, a)
        got = receiver.call("many", [("wait", (r, S.SUCCESS, W)) for r in rooms], timeout=120)
        assert got == [S.SUCCESS] * 64
        assert [snd.wait(r, S.SUCCESS, W) for r in rooms] == [S.SUCCESS] * 64

        pool1, aux1 = receiver.call("pool")
        want_pool, want_aux = pool0.copy(), aux0.copy()
        for (src, dst), sa, da in zip(tables, src_aux, dst_aux):
            want_pool[dst] = spool[src]
            want_aux[da] = saux[sa]
        # Whole pools compared byte for byte: written blocks match, all others are untouched.
        assert np.array_equal(bytes_of(pool1), bytes_of(want_pool))
        assert np.array_equal(bytes_of(aux1), bytes_of(want_aux))
        assert sorted(receiver.call("release_all")) == sorted(rooms)
        for r in rooms:
            snd.release(r)
        assert snd.stats().rooms == 0
    finally:
        snd.close()
    assert_child_clean(receiver)


def test_abort_by_either_side(backend, receiver):
    rng = np.random.default_rng(8)
    tables = rand_tables(rng, 9, SEND_BLOCKS, RECV_BLOCKS, max_len=4)
    rooms = room_ids(rng, 9)
    snd, spool, _ = make_sender(backend)
    try:
        for r in rooms:
            snd.add_room(r)
        receiver.call("many", [("add_room", (r, snd.bootstrap_address, dst, None)) for r, (_, dst) in zip(rooms, tables)])
        assert [snd.wait(r, S.WAITING_FOR_INPUT, W) for r in rooms] == [S.WAITING_FOR_INPUT] * 9
        receiver.call("many", [("abort", (r, "client disconnected")) for r in rooms[:4]])
        snd.abort(rooms[8], "prefill failed")
        for r, (src, _) in list(zip(rooms, tables))[2:8]:  # rooms 2 and 3 race with their abort
            snd.send(r, src)
        theirs = receiver.call("many", [("wait", (r, S.SUCCESS, W)) for r in rooms], timeout=120)
        ours = [snd.wait(r, S.SUCCESS, W) for r in rooms]
        assert theirs == ours  # both sides agree on every room
        assert ours[:2] == [S.FAILED] * 2 and ours[4:8] == [S.SUCCESS] * 4 and ours[8] == S.FAILED
        assert "client disconnected" in snd.failure_reason(rooms[0])
        assert "prefill failed" in receiver.call("failure_reason", rooms[8])
        pool1, _ = receiver.call("pool")
        for (src, dst), state in zip(tables, ours):
            if state == S.SUCCESS:
                assert np.array_equal(bytes_of(pool1[dst]), bytes_of(spool[src]))
        receiver.call("release_all")
        for r in rooms:
            snd.release(r)
        assert snd.stats().rooms == 0
    finally:
        snd.close()
    assert_child_clean(receiver)


def test_destination_never_arrives_and_orphans_expire(backend, receiver):
    import socket
    with socket.socket() as s:  # a 127.0.0.1 port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = keyed(f"tcp://127.0.0.1:{s.getsockname()[1]}")
    snd, _, _ = make_sender(backend)
    try:
        snd.add_room(1)  # the receiver never sends a destination for it
        receiver.call("many", [("add_room", (2, snd.bootstrap_address, [1, 2], 0)),  # no request at the sender
                               ("add_room", (3, dead, [3], None))])                  # sender unreachable
        assert snd.wait(1, S.SUCCESS, W) == S.FAILED
        assert "bootstrap timeout" in snd.failure_reason(1)
        assert receiver.call("many", [("wait", (2, S.SUCCESS, W)), ("wait", (3, S.SUCCESS, W))], timeout=60) \
            == [S.FAILED, S.FAILED]
        assert "no request for this room" in receiver.call("failure_reason", 2)
        snd.release(1)
        receiver.call("release_all")
        assert snd.stats().rooms == 0
    finally:
        snd.close()
    assert_child_clean(receiver)


def test_receiver_killed_during_transfer_then_a_new_one_works(backend):
    # Bigger blocks (256 KiB) so the kill lands while writes are still being posted.
    shape = (2, 2, 64, 2, 128)
    rcv = Peer.start("receiver", config(backend), seed=3, num_blocks=256, aux_slots=16, shape=shape)
    snd = None
    try:
        pool, aux = make_pool(4, 256, 16, shape)
        snd = KVSender(pool, aux, TransferConfig(**config(backend)))
        rooms = list(range(100, 116))
        for r in rooms:
            snd.add_room(r)
        rcv.call("many", [("add_room", (r, snd.bootstrap_address, list(range(16 * i, 16 * i + 16)), i))
                          for i, r in enumerate(rooms)])
        assert [snd.wait(r, S.WAITING_FOR_INPUT, W) for r in rooms] == [S.WAITING_FOR_INPUT] * 16
        for i, r in enumerate(rooms):
            snd.send(r, list(range(255 - i, 255 - i - 16, -1)), i)
        rcv.kill()
        states = [snd.wait(r, S.SUCCESS, W) for r in rooms]
        assert all(s.is_terminal for s in states), states
        assert snd._loop._thread.is_alive()  # nothing escaped into the endpoint's loop
        for r in rooms:
            snd.release(r)
        deadline = time.monotonic() + W
        while snd.stats().peers and time.monotonic() < deadline:  # the dead peer is removed
            time.sleep(0.05)
        assert snd.stats() == type(snd.stats())(0, 0, 0, 0)

        # A fresh receiver registers with the same sender and gets its bytes.
        rcv2 = Peer.start("receiver", config(backend), seed=5, num_blocks=256, aux_slots=16, shape=shape)
        try:
            snd.add_room(7)
            rcv2.call("add_room", 7, snd.bootstrap_address, [10, 11], 3)
            assert snd.wait(7, S.WAITING_FOR_INPUT, W) == S.WAITING_FOR_INPUT
            snd.send(7, [0, 1], 2)
            assert rcv2.call("wait", 7, S.SUCCESS, W, timeout=60) == S.SUCCESS
            p, a = rcv2.call("pool")
            assert np.array_equal(bytes_of(p[[10, 11]]), bytes_of(pool.numpy()[[0, 1]]))
            assert np.array_equal(a[3], aux.numpy()[2])
        finally:
            rcv2.stop()
    finally:
        if snd is not None:
            snd.close()
        rcv.kill()


def test_sender_killed_receiver_frees_everything(backend):
    snd = Peer.start("sender", config(backend), seed=1, num_blocks=SEND_BLOCKS, aux_slots=SEND_SLOTS)
    try:
        pool, aux = make_pool(6, RECV_BLOCKS, RECV_SLOTS)
        with KVReceiver(pool, aux, TransferConfig(**config(backend))) as rcv:
            rooms = [11, 12, 13, 14]
            snd.call("many", [("add_room", (r,)) for r in rooms])
            for i, r in enumerate(rooms):
                rcv.add_room(r, snd.info["address"], [2 * i, 2 * i + 1], i)
            assert snd.call("many", [("wait", (r, S.WAITING_FOR_INPUT, W)) for r in rooms], timeout=60) \
                == [S.WAITING_FOR_INPUT] * 4
            snd.kill()
            assert [rcv.wait(r, S.SUCCESS, W) for r in rooms] == [S.FAILED] * 4
            assert all("sender lost" in rcv.failure_reason(r) for r in rooms)
            for r in rooms:
                rcv.release(r)
            assert rcv.stats() == type(rcv.stats())(0, 0, 0, 0)
    finally:
        snd.kill()


def test_malformed_and_wrong_version_messages_are_rejected(backend, caplog):
    snd, spool, _ = make_sender(backend)
    ctx = zmq.Context()
    url, server_key = split_address(snd.bootstrap_address)
    sock = as_client(ctx.socket(zmq.DEALER), SECRET.shared_identity(), server_key)  # an insider's bugs
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(url)
    try:
        with caplog.at_level(logging.ERROR, logger="kvtransfer"):
            bad = [b"\xc1 not msgpack", msgpack.packb({"v": 99, "t": "ping", "seq": 1}),
                   msgpack.packb({"v": 1, "t": "destination", "room": "x", "blocks": [], "aux_slot": None}),
                   msgpack.packb({"v": 1, "t": "hello"})]
            for b in bad:
                sock.send(b)
            sock.send_multipart([b"two", b"frames"])
            sock.send(schema.encode(schema.Register("intruder", backend, b"\x00garbage metadata")))
            sock.send(schema.encode(schema.Destination(5, [1], None)))  # registration failed: refused
            replies = []
            while len(replies) < 7 and sock.poll(int(W * 1000)):
                replies.append(schema.decode(sock.recv()))
        kinds = [type(m).__name__ for m in replies]
        assert kinds == ["Error"] * 5 + ["Registered", "Abort"], kinds
        assert "version" in replies[1].reason and replies[5].ok is False
        assert sum("rejected" in r.getMessage() for r in caplog.records) >= 5
        assert snd._loop._thread.is_alive()

        # The endpoint still serves a well-behaved receiver.
        pool, aux = make_pool(9, RECV_BLOCKS, RECV_SLOTS)
        with KVReceiver(pool, aux, TransferConfig(**config(backend))) as rcv:
            snd.add_room(42)
            rcv.add_room(42, snd.bootstrap_address, [5, 6], 1)
            assert snd.wait(42, S.WAITING_FOR_INPUT, W) == S.WAITING_FOR_INPUT
            snd.send(42, [7, 8], 0)
            assert rcv.wait(42, S.SUCCESS, W) == S.SUCCESS and snd.wait(42, S.SUCCESS, W) == S.SUCCESS
            assert np.array_equal(bytes_of(pool.numpy()[[5, 6]]), bytes_of(spool[[7, 8]]))
    finally:
        sock.close(0)
        ctx.term()
        snd.close()
