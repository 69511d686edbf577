"""BootstrapServer: the sender (prefill) side's ZMQ ROUTER that receivers register with.

Only peers holding the deployment's secret can connect (CURVE, data_plane_auth.py), so a routing
id here is an authenticated receiver's. It only moves validated messages: every received message is decoded against bootstrap_schema, and a
malformed one is logged and answered with an Error, never allowed to raise into the endpoint loop.
What a message means is KVSender's business.
"""
from __future__ import annotations

import logging

import zmq

from raypd.kvtransfer.bootstrap import schema
from raypd.kvtransfer.bootstrap.socket_liveness import routes_to_the_newest
from raypd.kvtransfer.data_plane_auth import DataPlaneSecret, HandshakeWatch, as_server
from raypd.kvtransfer.errors import SchemaError

log = logging.getLogger(__name__)


class BootstrapServer:
    def __init__(self, ctx: zmq.Context, host: str, port: int, max_message_bytes: int, secret: DataPlaneSecret):
        self.socket = as_server(ctx.socket(zmq.ROUTER), secret)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a vanished peer raises, not blocks
        routes_to_the_newest(self.socket)  # a receiver restarted under its name is heard at once
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        if port:
            self.socket.bind(f"tcp://{host}:{port}")
        else:
            port = self.socket.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.watch = HandshakeWatch(self.socket, f"bootstrap {self.address}")  # poll watch.socket too

    def receive(self) -> list[tuple[bytes, schema.Message]]:
        self.watch.drain()
        out: list[tuple[bytes, schema.Message]] = []
        while True:
            try:
                frames = self.socket.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return out
            identity = frames[0]
            try:
                if len(frames) != 2:
                    raise SchemaError(f"expected one frame after the routing id, got {len(frames) - 1}")
                out.append((identity, schema.decode(frames[1])))
            except SchemaError as e:
                log.error("bootstrap %s: rejected a message from %r: %s", self.address, identity[:64], e)
                self.send(identity, schema.Error(reason=f"rejected: {e}"[:1000]))

    def send(self, identity: bytes, msg: schema.Message) -> bool:
        try:
            self.socket.send_multipart([identity, schema.encode(msg)], flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError as e:  # EHOSTUNREACH: the peer disconnected; heartbeats will tell
            log.debug("bootstrap %s: cannot send %s to %r: %s", self.address, type(msg).__name__, identity[:64], e)
            return False

    def close(self) -> None:
        self.watch.close()
        self.socket.close(linger=0)
