"""A node restarted under its name while its old connection is still open (a host lost without a FIN:
half-open) is heard at once: the bootstrap ROUTER hands the name over to the newest connection, and
its replies go there. Real sockets on loopback, the old link left open as a lost host's would be."""
from __future__ import annotations

import time

import zmq

from raypd.kvtransfer.bootstrap import schema
from raypd.kvtransfer.bootstrap.client import BootstrapLink
from raypd.kvtransfer.bootstrap.server import BootstrapServer
from raypd.kvtransfer.data_plane_auth import DataPlaneSecret, unguard

SECRET = DataPlaneSecret.generate()
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
    server = BootstrapServer(ctx, "127.0.0.1", 0, 1 << 20, SECRET)
    old = BootstrapLink(ctx, server.address, "raypd-decode-0", 1 << 20, time.monotonic(), SECRET)
    new = None
    try:
        assert old.send(schema.Ping(1))
        assert first(server.receive) == [(b"raypd-decode-0", schema.Ping(1))]
        # The node restarts (a new process, the same name); the old connection is never closed.
        new = BootstrapLink(ctx, server.address, "raypd-decode-0", 1 << 20, time.monotonic(), SECRET)
        assert new.send(schema.Ping(2))
        assert first(server.receive) == [(b"raypd-decode-0", schema.Ping(2))]   # heard, not ignored
        assert server.send(b"raypd-decode-0", schema.Pong(2, "raypd-prefill-0", False))
        assert first(new.receive) == [schema.Pong(2, "raypd-prefill-0", False)]
        assert first(old.receive, 0.5) == []                                      # the name is the new one's
    finally:
        for link in (old, new):
            if link is not None:
                link.close()
        server.socket.close(linger=0)
        server.close()
        unguard(ctx)
        ctx.term()
