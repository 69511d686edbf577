"""The data plane admits only the peers its control plane registered: every socket a stranger can reach
(the bootstrap ROUTER, the tcp backend's data ROUTER, a driver's token PULL) is tried with real sockets
whose keys were never registered, and must refuse them without changing anything. Insiders (a
registered node's keys) can act only as themselves (no registration or write under another node's
name) and are bounded too: orphan destinations, oversize messages, writes outside an open window."""
from __future__ import annotations

import asyncio
import logging
import pickle
import time

import msgpack
import numpy as np
import pytest
import zmq

from raypd.cluster.client.token_receiver import TokenReceiver
from raypd.kvtransfer import KVReceiver, KVSender, TransferConfig
from raypd.kvtransfer import TransferState as S
from raypd.kvtransfer.bootstrap import schema
from raypd.kvtransfer.data_plane_auth import DataPlaneSecret, as_client, as_server, refused, unguard
from raypd.kvtransfer.identity import DataPlaneIdentity, split_address
from raypd.kvtransfer.tcp_backend import TcpBackend
from raypd.node.streams import Reply, TokenStreams
from raypd.protocol.messages import TokenChunk, pack_chunks
from tests.kvtransfer.peer_proc import make_pool

SECRET = DataPlaneSecret.generate()
# The deployment's nodes, as its control plane registered them: p0 sends, d0 receives, the rest are
# insiders whose keys every node admits.
NODES = ["p0", "d0", "p1", "d1", "flooder", "big-talker"]
W = 10.0
QUIET_MS = 500  # how long a refused socket is given to get an answer it must not get


def identity(name: str) -> DataPlaneIdentity:
    return SECRET.identity(name, NODES)


def config(name: str = "p0", **kw) -> TransferConfig:
    return TransferConfig(**{"backend": "tcp", "identity": identity(name), "bootstrap_timeout_s": 5.0,
                             "heartbeat_interval_s": 0.25, "heartbeat_timeout_s": 3.0, "max_message_bytes": 64 << 10,
                             "max_orphans": 64, **kw})


def receiver(name: str = "d0") -> KVReceiver:
    rcv_pool, rcv_aux = make_pool(2, 64, 8)
    rcv = KVReceiver(rcv_pool, rcv_aux, config(name), name=name)
    rcv.test_pool, rcv.test_aux = rcv_pool, rcv_aux  # type: ignore[attr-defined]  # where its KV lands
    return rcv


def insider(ctx: zmq.Context, name: str, address: str) -> zmq.Socket:
    """A DEALER with registered node `name`'s own keys, connected to the keyed `address`."""
    url, server_key = split_address(address)
    sock = as_client(ctx.socket(zmq.DEALER), identity(name), server_key)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(url)
    return sock


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.fixture
def sender():
    pool, aux = make_pool(1, 64, 8)
    snd = KVSender(pool, aux, config("p0"), name="p0")
    snd.test_pool = pool  # type: ignore[attr-defined]  # the bytes its writes carry
    yield snd
    snd.close()


def stranger(ctx: zmq.Context, kind: str, how: str, address: str, routing_id: bytes | None = None) -> zmq.Socket:
    """A socket with keys nobody registered, connected to the keyed `address`: `plain` (no CURVE),
    `guess` (CURVE, a made-up server key), `knows-server-key` (the server's public key, its own client
    key: only ZAP can stop it), `other-deployment` (another deployment's node of the same name as the
    one it poses as)."""
    url, server_key = split_address(address)
    sock = ctx.socket(getattr(zmq, kind))
    sock.setsockopt(zmq.LINGER, 0)
    if routing_id is not None:
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
    if how == "guess":
        as_client(sock, DataPlaneIdentity.generate("stranger"), DataPlaneIdentity.generate("x").public_key)
    elif how == "knows-server-key":
        as_client(sock, DataPlaneIdentity.generate("stranger"), server_key)
    elif how == "other-deployment":
        as_client(sock, DataPlaneSecret.generate().identity("d0"), server_key)
    sock.connect(url)
    return sock


STRANGERS = ["plain", "guess", "knows-server-key", "other-deployment"]


def send_if_queued(sock: zmq.Socket, frame: bytes) -> None:
    """Send without blocking. A connection refused in its handshake is dropped at once (so fast, for a
    plain client, that the socket may already have no peer to queue for): then there is nothing to send."""
    try:
        sock.send(frame, zmq.NOBLOCK)
    except zmq.Again:
        pass


TEXT_SECRET = "9f1c2e7a5b3d4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a"  # `openssl rand -hex 32`


def test_the_secret_never_prints_and_survives_pickling():
    s = DataPlaneSecret.from_text(f"  {TEXT_SECRET}\n")
    node = s.identity("p0", ["d0"])
    assert "9f1c2e7a" not in repr(s) and "9f1c2e7a" not in str(s)
    for text in (repr(node), str(node), repr(TransferConfig(identity=node))):  # nor a node's own secret key
        assert node.secret_key.decode() not in text and "9f1c2e7a" not in text
    assert pickle.loads(pickle.dumps(s)) == s and s != DataPlaneSecret.generate()
    assert s.public_key_of("p0") == DataPlaneSecret(TEXT_SECRET.encode()).public_key_of("p0")


@pytest.mark.parametrize("value", [b"short", b"correct horse battery staple", b"a" * 64, b"ab" * 40],
                         ids=["short", "phrase", "repeated", "two-letters"])
def test_a_short_or_guessable_secret_is_refused(value):
    with pytest.raises(ValueError, match="at least 32 bytes|guessable"):
        DataPlaneSecret(value)


def test_every_byte_of_the_secret_counts():
    head = TEXT_SECRET.encode() * 2   # 128 bytes: more than a BLAKE2b key holds
    assert DataPlaneSecret(head + b"1").public_key_of("p0") != DataPlaneSecret(head + b"2").public_key_of("p0")


def test_without_its_zap_handler_a_server_refuses_everyone():
    """A CURVE server whose ZAP handler is gone fails closed (ZAP_ENFORCE_DOMAIN): libzmq's default
    would admit a client that knows only the server's public key."""
    ctx = zmq.Context()
    srv = cli = None
    try:
        srv = as_server(ctx.socket(zmq.PULL), identity("p0"))
        port = srv.bind_to_random_port("tcp://127.0.0.1")
        unguard(ctx)                                  # the handler stopped (or never ran)
        cli = stranger(ctx, "PUSH", "knows-server-key", identity("p0").address(f"tcp://127.0.0.1:{port}"))
        cli.send(b"hello", zmq.NOBLOCK)
        assert not srv.poll(QUIET_MS)
    finally:
        for sock in (cli, srv):
            if sock is not None:
                sock.close(linger=0)
        ctx.term()


@pytest.mark.parametrize("how", STRANGERS)
def test_a_stranger_gets_nothing_from_the_bootstrap_and_changes_nothing(sender, ctx, how, caplog):
    with receiver() as rcv:
        rcv_pool = rcv.test_pool  # type: ignore[attr-defined]
        # The impostor connects first, under the name the real receiver will use, and registers.
        sock = stranger(ctx, "DEALER", how, sender.bootstrap_address, routing_id=rcv.name.encode())
        with caplog.at_level(logging.WARNING, logger="raypd.kvtransfer.data_plane_auth"):
            for message in (schema.Register(rcv.name, "tcp", rcv.backend.metadata()),
                            schema.Destination(7, [1, 2], None), schema.Ping(1)):
                send_if_queued(sock, schema.encode(message))
            assert not sock.poll(QUIET_MS)  # no Registered, no Abort, no Pong: it never got in
            time.sleep(0.1)  # the loop reads the handshake monitor on its next pass
        assert sender.peers() == [] and not sender._orphans
        # Refused in the handshake, counted and logged with the reason.
        assert sender._server.watch.refused >= 1
        assert any("refused a connection in the handshake" in r.getMessage() for r in caplog.records)
        if how in ("knows-server-key", "other-deployment"):  # the handshake reached ZAP, which refused it
            assert refused(sender._ctx) >= 1
            assert any("the control plane did not register" in r.getMessage() for r in caplog.records)
        # The real receiver still registers under its name and its KV arrives intact.
        sender.add_room(11)
        rcv.add_room(11, sender.bootstrap_address, [5, 6], 1)
        assert sender.wait(11, S.WAITING_FOR_INPUT, W) == S.WAITING_FOR_INPUT
        sender.send(11, [3, 4], 2)
        assert rcv.wait(11, S.SUCCESS, W) == S.SUCCESS
        assert np.array_equal(rcv_pool.numpy()[[5, 6]], sender.test_pool.numpy()[[3, 4]])  # type: ignore[attr-defined]
        sock.close(0)


def test_a_registered_node_cannot_register_as_another(sender, ctx, caplog):
    """d1 holds its own registered keys and registers at p0's bootstrap under d0's name: refused, for
    its key does not own that name; d0 itself then registers and receives intact KV."""
    sock = insider(ctx, "d1", sender.bootstrap_address)
    try:
        with receiver("d0") as rcv, caplog.at_level(logging.ERROR, logger="raypd.kvtransfer.sender"):
            backend = TcpBackend(config("d1"), "d0")  # its own data socket, announced under d0's name
            backend.register(*make_pool(2, 64, 8))
            try:
                sock.send(schema.encode(schema.Register("d0", "tcp", backend.metadata())))
                assert sock.poll(int(W * 1000))
                answer = schema.decode(sock.recv())
                assert isinstance(answer, schema.Registered) and not answer.ok
                assert "d1's key does not own the name 'd0'" in answer.error
                sock.send(schema.encode(schema.Destination(41, [1], None)))  # not registered: refused
                assert sock.poll(int(W * 1000))
                assert schema.decode(sock.recv()) == schema.Abort(41, "receiver is not registered with this sender")
            finally:
                backend.close()
            assert sender.peers() == []
            sender.add_room(42)
            rcv.add_room(42, sender.bootstrap_address, [3], 0)
            sender.send(42, [1], 1)
            assert rcv.wait(42, S.SUCCESS, W) == S.SUCCESS and sender.peers() == ["d0"]
            assert np.array_equal(rcv.test_pool.numpy()[3], sender.test_pool.numpy()[1])  # type: ignore[attr-defined]
    finally:
        sock.close(0)


def forged_piece(writer: str, notif: bytes, off: int, n: int) -> list[bytes]:
    return [msgpack.packb({"v": 3, "x": 1, "w": writer, "notif": notif, "off": off, "n": n}), b"\x7f" * n]


@pytest.mark.parametrize("how", [*STRANGERS, "insider-without-window", "insider-as-the-writer"])
def test_forged_kv_pieces_change_no_byte_of_the_pool(sender, ctx, how):
    with receiver() as rcv:
        rcv_pool, rcv_aux = rcv.test_pool, rcv.test_aux  # type: ignore[attr-defined]
        # A room is open and its window too: the forger even knows its notification.
        sender.add_room(21)
        rcv.add_room(21, sender.bootstrap_address, [5, 6], 1)
        assert sender.wait(21, S.WAITING_FOR_INPUT, W) == S.WAITING_FOR_INPUT
        before = rcv_pool.clone(), rcv_aux.clone()
        address = rcv.backend.address  # type: ignore[attr-defined]
        if how.startswith("insider"):
            # p1 is registered: it connects, but no window names it, and it may not write as p0.
            sock, writer = insider(ctx, "p1", address), "p1" if how == "insider-without-window" else "p0"
        else:
            sock, writer = stranger(ctx, "DEALER", how, address, routing_id=sender.name.encode()), "p0"
        bn = rcv.layout.block_nbytes
        notif = schema.notification_for(21)
        for off in (5 * bn, 0, 6 * bn):  # inside the room's blocks, and outside them
            sock.send_multipart(forged_piece(writer, notif, off, bn), zmq.NOBLOCK)
        sock.send_multipart([msgpack.packb({"v": 3, "x": 1, "w": writer, "notif": notif, "end": True, "pieces": 3,
                                            "aux_off": -1}), b""], zmq.NOBLOCK)
        if how.startswith("insider"):  # an insider gets its refusal back
            assert sock.poll(int(W * 1000))
            ack = msgpack.unpackb(sock.recv())
            assert ack["ok"] is False
            if how == "insider-as-the-writer":
                assert ack["error"] == "p1 may not write as 'p0'"
        else:
            assert not sock.poll(QUIET_MS)
        time.sleep(0.2)  # let the receiver's loop read whatever it was going to read
        assert rcv.poll(21) == S.WAITING_FOR_INPUT  # no notification was taken for the room
        if not how.startswith("insider"):
            assert rcv.backend._watch.refused >= 1  # type: ignore[attr-defined]
        assert np.array_equal(rcv_pool.numpy(), before[0].numpy()) and np.array_equal(rcv_aux.numpy(), before[1].numpy())
        sock.close(0)
        # The real writer still lands the room's KV.
        sender.send(21, [3, 4], 2)
        assert rcv.wait(21, S.SUCCESS, W) == S.SUCCESS
        assert np.array_equal(rcv_pool.numpy()[[5, 6]], sender.test_pool.numpy()[[3, 4]])  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", [*STRANGERS, "a-node-it-never-sent-to"])
def test_a_stranger_cannot_push_tokens_to_a_driver(ctx, how):
    async def main():
        rx = TokenReceiver("127.0.0.1")
        rx.admit("d0", identity("d0").public_key.decode())  # the node it sent r1 to
        try:
            stream = rx.open("r1")
            if how == "a-node-it-never-sent-to":  # registered with the deployment, not with this driver
                bad_node = TokenStreams(identity("d1"))
                assert bad_node.open("r1", rx.address, Reply())
                bad_node.push(TokenChunk("r1", (666,), finished=True))
                bad_node.flush()
            else:
                bad = stranger(ctx, "PUSH", how, rx.address)
                bad.send(pack_chunks([TokenChunk("r1", (666,), finished=True)]), zmq.NOBLOCK)
            await asyncio.sleep(QUIET_MS / 1000)
            assert rx.num_messages == 0 and rx._watch.refused >= 1
            good = TokenStreams(identity("d0"))
            assert good.open("r1", rx.address, Reply())
            good.push(TokenChunk("r1", (1, 2), finished=True))
            good.flush()
            got = await stream._take(W)
            good.close()
            if how == "a-node-it-never-sent-to":
                bad_node.close()
            else:
                bad.close(0)
            return got
        finally:
            rx.close()
    got = asyncio.run(main())
    assert [t for c in got for t in c.token_ids] == [1, 2]


def test_an_unkeyed_address_is_refused_before_anything_connects():
    """An address without its server's key names nobody: the receiver refuses the room and a node
    refuses the stream, at once and with a typed error."""
    from raypd.kvtransfer.identity import UnkeyedAddressError
    with receiver() as rcv:
        with pytest.raises(UnkeyedAddressError, match="names no server key"):
            rcv.add_room(1, "tcp://127.0.0.1:9", [1], None)
        assert rcv.stats().rooms == 0 and rcv.links() == []

    async def stream_to_an_unkeyed_address():
        node, reply = TokenStreams(identity("d0")), Reply()
        try:
            assert not node.open("r", "tcp://127.0.0.1:9", reply)
            return (await reply.wait(W)).final.error
        finally:
            node.close()
    assert "names no server key" in asyncio.run(stream_to_an_unkeyed_address())


def test_a_flood_of_orphan_destinations_stays_bounded(sender, ctx):
    # An insider with a well-formed registration sends destinations for rooms the sender never gets.
    backend = TcpBackend(config("flooder"), "flooder")
    pool, aux = make_pool(3, 64, 8)
    backend.register(pool, aux)
    sock = insider(ctx, "flooder", sender.bootstrap_address)
    try:
        sock.send(schema.encode(schema.Register("flooder", "tcp", backend.metadata())))
        assert sock.poll(int(W * 1000)) and schema.decode(sock.recv()).ok  # type: ignore[union-attr]
        n = sender.config.max_orphans + 100
        for room in range(1, n + 1):
            sock.send(schema.encode(schema.Destination(room, [1], None)), zmq.NOBLOCK)
        refusals = []
        deadline = time.monotonic() + W
        while len(refusals) < 100 and time.monotonic() < deadline:
            if sock.poll(100):
                msg = schema.decode(sock.recv())
                if isinstance(msg, schema.Abort):
                    refusals.append(msg.room)
        assert len(refusals) == 100 and min(refusals) > sender.config.max_orphans
        assert len(sender._orphans) == sender.config.max_orphans
    finally:
        sock.close(0)
        backend.close()


def test_an_oversize_message_is_dropped_and_the_endpoint_keeps_serving(sender, ctx):
    sock = insider(ctx, "big-talker", sender.bootstrap_address)
    sock.send(schema.encode(schema.Ping(1)))
    assert sock.poll(int(W * 1000)) and isinstance(schema.decode(sock.recv()), schema.Pong)
    sock.send(b"\x00" * (sender.config.max_message_bytes + 1))  # ZMQ drops it (and the connection)
    # Our code never saw it (it would answer a message it cannot decode with an Error); the socket
    # may reconnect and get answers to what it sends next, as any peer would.
    replies = []
    while sock.poll(QUIET_MS):
        replies.append(schema.decode(sock.recv()))
    assert not any(isinstance(m, schema.Error) for m in replies), replies
    assert sender._loop._thread.is_alive() and sender.peers() == []
    sock.close(0)
    with receiver() as rcv:
        sender.add_room(31)
        rcv.add_room(31, sender.bootstrap_address, [1], None)
        sender.send(31, [2])
        assert rcv.wait(31, S.SUCCESS, W) == S.SUCCESS


def test_two_deployments_in_one_process_each_admit_only_their_own_nodes():
    """Drivers share the process's ZMQ context (and so its ZAP handler): each still hears only the
    node it admitted, although the other deployment's node has the same name."""
    other = DataPlaneSecret.generate()

    async def main():
        a, b = TokenReceiver("127.0.0.1"), TokenReceiver("127.0.0.1")
        node_a, node_b = TokenStreams(SECRET.identity("n")), TokenStreams(other.identity("n"))
        a.admit("n", SECRET.public_key_of("n").decode())
        b.admit("n", other.public_key_of("n").decode())
        try:
            streams = {rx: rx.open("r") for rx in (a, b)}
            # Each node pushes to both drivers; only its own deployment's driver may hear it.
            for node, tok in ((node_a, 1), (node_b, 2)):
                for rx in (a, b):
                    assert node.open("r", rx.address, Reply())
                    node.push(TokenChunk("r", (tok,), finished=True))
                node.flush()
            got = {rx: [t for c in await streams[rx]._take(W) for t in c.token_ids] for rx in (a, b)}
            await asyncio.sleep(QUIET_MS / 1000)
            return got[a], got[b], a.num_messages, b.num_messages
        finally:
            node_a.close()
            node_b.close()
            a.close()
            b.close()
    assert asyncio.run(main()) == ([1], [2], 1, 1)
