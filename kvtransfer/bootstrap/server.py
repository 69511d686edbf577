"""BootstrapServer: the sender (prefill) side's ZMQ ROUTER that receivers register with.

Only peers the control plane registered can connect (CURVE, data_plane_auth.py), and each message
comes with the principal its connection's key belongs to. Routing ids name connections, not peers
(identity.connection_id: unique and unguessable), and the ROUTER hands none over: a peer cannot take
another's route, and a receiver that restarts comes on a new connection, with a new id, and registers
again. Only validated messages move: each
is decoded against bootstrap_schema, and a malformed one is logged and answered with an Error, never
allowed to raise into the endpoint loop. What a message means is KVSender's business.
"""
from __future__ import annotations

import logging

import zmq

from raypd.kvtransfer.bootstrap import schema
from raypd.kvtransfer.bootstrap.socket_liveness import keep_alive
from raypd.kvtransfer.data_plane_auth import HandshakeWatch, as_server, log_refusal, sender_of
from raypd.kvtransfer.errors import SchemaError
from raypd.kvtransfer.identity import DataPlaneIdentity

log = logging.getLogger(__name__)


class BootstrapServer:
    def __init__(self, ctx: zmq.Context, host: str, port: int, max_message_bytes: int, identity: DataPlaneIdentity):
        self._peers = identity.peers
        self.socket = as_server(ctx.socket(zmq.ROUTER), identity)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a vanished peer raises, not blocks
        keep_alive(self.socket)
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        if port:
            self.socket.bind(f"tcp://{host}:{port}")
        else:
            port = self.socket.bind_to_random_port(f"tcp://{host}")
        self.url = f"tcp://{host}:{port}"
        self.address = identity.address(self.url)  # keyed: a receiver connects knowing whose it is
        self.watch = HandshakeWatch(self.socket, f"bootstrap {self.url}")  # poll watch.socket too
        self.unattributed = 0  # messages whose connection's key is no longer admitted

    def receive(self) -> list[tuple[bytes, str, schema.Message]]:
        """(routing id, the sender's principal, message) of each message that arrived."""
        self.watch.drain()
        out: list[tuple[bytes, str, schema.Message]] = []
        while True:
            try:
                frames = self.socket.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return out
            route = frames[0].bytes
            principal = sender_of(self._peers, frames[0])
            if principal is None:  # admitted at the handshake, forgotten since
                self.unattributed += 1
                log_refusal(self.unattributed, "bootstrap %s: dropped a message from a key no longer admitted",
                            self.url)
                continue
            try:
                if len(frames) != 2:
                    raise SchemaError(f"expected one frame after the routing id, got {len(frames) - 1}")
                out.append((route, principal, schema.decode(frames[1].bytes)))
            except SchemaError as e:
                log.error("bootstrap %s: rejected a message from %s: %s", self.url, principal, e)
                self.send(route, schema.Error(reason=f"rejected: {e}"[:1000]))

    def send(self, identity: bytes, msg: schema.Message) -> bool:
        try:
            self.socket.send_multipart([identity, schema.encode(msg)], flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError as e:  # EHOSTUNREACH: the peer disconnected; heartbeats will tell
            log.debug("bootstrap %s: cannot send %s to %r: %s", self.url, type(msg).__name__, identity[:64], e)
            return False

    def close(self) -> None:
        self.watch.close()
        self.socket.close(linger=0)
