"""BootstrapLink: a receiver (decode) endpoint's connection to one sender's bootstrap server.

One DEALER per sender address. The address is keyed (identity.py): the link talks only to the holder
of that key, the server's principal (`server_principal`, None when this endpoint's allow-list does not
know the key). It registers once (the receiver's name and transfer metadata; the sender checks that
the link's key owns the name), then carries per-room messages and heartbeats. `registered` and
`server_name` record the sender's answer; a Pong that no longer knows us, or comes from another
server name, means the sender restarted and the link must be rebuilt.
"""
from __future__ import annotations

import logging

import zmq

from raypd.kvtransfer.bootstrap import schema
from raypd.kvtransfer.bootstrap.socket_liveness import keep_alive
from raypd.kvtransfer.data_plane_auth import as_client
from raypd.kvtransfer.errors import SchemaError
from raypd.kvtransfer.identity import DataPlaneIdentity, connection_id, split_address

log = logging.getLogger(__name__)


class BootstrapLink:
    def __init__(self, ctx: zmq.Context, address: str, name: str, max_message_bytes: int, now: float,
                 identity: DataPlaneIdentity):
        """Raises identity.UnkeyedAddressError for an address without a server key."""
        self.address = address
        url, server_key = split_address(address)
        self.server_principal = identity.peers.principal_of(server_key)
        self.socket = as_client(ctx.socket(zmq.DEALER), identity, server_key)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTING_ID, connection_id(name))
        keep_alive(self.socket)
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self.socket.connect(url)
        self.registered = False
        self.server_name: str | None = None
        self.last_heard = now    # the heartbeat clock starts at creation: an unreachable sender times out
        self.next_ping = now
        self.seq = 0

    def send(self, msg: schema.Message) -> bool:
        try:
            self.socket.send(schema.encode(msg), flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError as e:
            log.warning("bootstrap link %s: cannot send %s: %s", self.address, type(msg).__name__, e)
            return False

    def receive(self) -> list[schema.Message]:
        out: list[schema.Message] = []
        while True:
            try:
                frames = self.socket.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                if len(frames) != 1:
                    raise SchemaError(f"expected one frame, got {len(frames)}")
                out.append(schema.decode(frames[0]))
            except SchemaError as e:
                log.error("bootstrap link %s: rejected a message: %s", self.address, e)

    def close(self) -> None:
        self.socket.close(linger=0)
