"""How a data-plane ZMQ connection notices a dead peer, and lets a restarted one back in.

The bootstrap and tcp-data ROUTERs route by the peer's name (its ROUTING_ID). A node restarted under
the same name while its old connection is still open - half-open after a host loss, where no FIN ever
comes - would be ignored by a plain ROUTER until that connection died: libzmq refuses a second
connection with a routing id in use. So:

  - ROUTER_HANDOVER on every such ROUTER: the newest connection with a name takes the name over;
    replies go to the node that is there now. (Only peers that hold the deployment's secret can
    connect at all: data_plane_auth.py.)
  - ZMTP heartbeats on both ends (PING every HEARTBEAT_IVL_MS, a connection silent for
    HEARTBEAT_TIMEOUT_MS is closed): a dead peer's connection goes within seconds, not after TCP's
    hours, and a DEALER then reconnects. The transfers' own heartbeats (TransferConfig.heartbeat_*)
    still decide when a room fails; these only keep the sockets honest.
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


def routes_to_the_newest(router: SocketT) -> SocketT:
    """ROUTER_HANDOVER and heartbeats on a ROUTER that routes by peer name (before bind)."""
    router.setsockopt(zmq.ROUTER_HANDOVER, 1)
    return keep_alive(router)
