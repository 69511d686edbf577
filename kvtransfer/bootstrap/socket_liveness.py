"""How a data-plane ZMQ connection notices a dead peer, and lets a restarted one back in.

A node restarted under the same name while its old connection is still open (half-open after a host
loss, where no FIN ever comes) must be heard at once. The bootstrap and tcp-data ROUTERs route by
connection: each DEALER connects with a routing id of its own that is new for every connection
(identity.connection_id), and who the peer is comes from its CURVE key (identity.py), not from that
id. So the restarted node's new connection never collides with the old one, and its replies go to
it. Both ends also send ZMTP heartbeats (PING every HEARTBEAT_IVL_MS; a connection silent for
HEARTBEAT_TIMEOUT_MS is closed): a dead peer's connection goes within seconds, not after TCP's hours,
and a DEALER then reconnects. The transfers' own heartbeats (TransferConfig.heartbeat_*) still decide
when a room fails; these only keep the sockets honest.
"""
from __future__ import annotations

from typing import TypeVar

import zmq

HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 5000
SocketT = TypeVar("SocketT", bound=zmq.Socket)


def keep_alive(sock: SocketT) -> SocketT:
    """ZMTP heartbeats on `sock` (before bind or connect)."""
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    return sock
