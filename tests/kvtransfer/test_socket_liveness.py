"""A node restarted under its name while its old connection is still open (a host lost without a FIN:
half-open) is heard at once: each connection has a routing id of its own, and the node is known by its
key, so the new connection is heard as the same node and its replies go there. Real sockets on
loopback, the old link left open as a lost host's would be."""
from __future__ import annotations

import time

import zmq

from raypd.kvtransfer.bootstrap import schema
from raypd.kvtransfer.bootstrap.client import BootstrapLink
from raypd.kvtransfer.bootstrap.server import BootstrapServer
from raypd.kvtransfer.data_plane_auth import DataPlaneSecret, unguard

SECRET = DataPlaneSecret.generate()
NODES = ["raypd-prefill-0", "raypd-decode-0"]
WAIT_S = 10.0


def first(read, wait_s: float = WAIT_S) -> list:
    """What read() returns first that is not empty, within wait_s (else [])."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if got := read():
            return got
        time.sleep(0.01)
    return []


def test_a_node_restarted_under_its_name_takes_its_route_over():
    ctx = zmq.Context()
    server = BootstrapServer(ctx, "127.0.0.1", 0, 1 << 20, SECRET.identity("raypd-prefill-0", NODES))
    decode = SECRET.identity("raypd-decode-0", NODES)  # a restarted node has the same keys (its name's)
    old = BootstrapLink(ctx, server.address, "raypd-decode-0", 1 << 20, time.monotonic(), decode)
    new = None
    try:
        assert old.send(schema.Ping(1))
        [(old_route, who, msg)] = first(server.receive)
        assert (who, msg) == ("raypd-decode-0", schema.Ping(1))
        # The node restarts (a new process, the same name); the old connection is never closed.
        new = BootstrapLink(ctx, server.address, "raypd-decode-0", 1 << 20, time.monotonic(), decode)
        assert new.send(schema.Ping(2))
        [(new_route, who, msg)] = first(server.receive)                       # heard, not ignored
        assert (who, msg) == ("raypd-decode-0", schema.Ping(2)) and new_route != old_route
        assert server.send(new_route, schema.Pong(2, "raypd-prefill-0", False))
        assert first(new.receive) == [schema.Pong(2, "raypd-prefill-0", False)]
        assert first(old.receive, 0.5) == []                                      # the reply went to the new one
    finally:
        for link in (old, new):
            if link is not None:
                link.close()
        server.socket.close(linger=0)
        server.close()
        unguard(ctx)
        ctx.term()
