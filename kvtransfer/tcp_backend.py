"""TcpBackend: the same contract over pyzmq, for machines without NIXL.

Each endpoint binds one ROUTER data socket (its keyed address goes in the metadata); a writer opens
one DEALER per peer. A write is a sequence of messages on that one pipe, which ZMQ delivers in order:

    [header {x, w, notif, off, n}, bytes]        one per piece of a run (runs cut at tcp_chunk_bytes)
    [header {x, w, notif, end, pieces, aux_off}, aux bytes]   last: aux slot + notification

Both sockets are CURVE sockets of their endpoints' identities (data_plane_auth.py, identity.py). The
writer is the endpoint named in the header (w) only if the key its connection authenticated owns that
name: a peer cannot write as another, whatever it puts in a header or a routing id (the ROUTER picks
those). The receiver copies a
piece into its pool only if the writer opened no other write under that id and the receiving side
has an open window for its notification from this writer covering every block the piece touches
(open_window/close_window: so a piece that arrives after its room was aborted or finished is
dropped, never written into blocks that may belong to another request by then). On the last message
it checks the piece count, queues the notification and answers {x, ok}: SUCCESS for the writer means the bytes
are in the peer's pool, like NIXL's local completion. Frames are sent zero-copy from CPU pools, so
the source blocks must stay untouched until the write is no longer TRANSFERRING (rooms ensure it).
A dead peer is not noticed here: writes stay TRANSFERRING until the endpoint times them out or
removes the peer (heartbeats).
"""
from __future__ import annotations

import itertools
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import cast

import msgpack
import numpy as np
import torch
import zmq

from raypd.kvtransfer.base import Notification, PeerInfo, TransferBackend, TransferState, WriteWindow, XferId
from raypd.kvtransfer.bootstrap.socket_liveness import keep_alive
from raypd.kvtransfer.config import TransferConfig
from raypd.kvtransfer.data_plane_auth import HandshakeWatch, as_client, as_server, log_refusal, sender_of, unguard
from raypd.kvtransfer.descriptors import coalesce_runs
from raypd.kvtransfer.errors import KVTransferError, PeerDisconnectedError, PeerError, TransferError
from raypd.kvtransfer.identity import UnkeyedAddressError, connection_id, owns, split_address
from raypd.kvtransfer.layout import PoolLayout
from raypd.kvtransfer.nixl.ucx_transport import PeerTransport

log = logging.getLogger(__name__)
_VERSION = 3  # 3: the writer names itself (w), checked against its key
# The acknowledgement a writer reads back is tiny; anything bigger on its socket is not ours.
_MAX_ACK_BYTES = 64 << 10


@dataclass(slots=True)
class _Out:
    peer: str
    state: TransferState = TransferState.TRANSFERRING
    error: KVTransferError | None = None


@dataclass(slots=True)
class _In:
    started: float
    notif: bytes
    pieces: int = 0
    bad: str | None = None


@dataclass(slots=True)
class _Peer:
    info: PeerInfo
    sock: zmq.Socket
    xfers: set[XferId] = field(default_factory=set)


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


class TcpBackend(TransferBackend):
    name = "tcp"
    revocable = True

    def __init__(self, config: TransferConfig, endpoint_name: str):
        super().__init__(config, endpoint_name)
        self._ctx = zmq.Context()
        self._closed = False
        self._peer_keys = config.identity.peers
        self._router = as_server(self._ctx.socket(zmq.ROUTER), config.identity)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        keep_alive(self._router)  # a restarted writer comes with a new routing id (identity.connection_id)
        self._router.setsockopt(zmq.RCVHWM, 0)
        self._router.setsockopt(zmq.MAXMSGSIZE, config.tcp_chunk_bytes + (1 << 20))
        port = self._router.bind_to_random_port(f"tcp://{config.host}")
        self.url = f"tcp://{config.host}:{port}"
        self.address = config.identity.address(self.url)
        self._watch = HandshakeWatch(self._router, f"tcp data {self.url}")
        self._peers: dict[str, _Peer] = {}
        self._out: dict[XferId, _Out] = {}
        self._in: dict[tuple[bytes, int], _In] = {}
        self._windows: dict[bytes, WriteWindow] = {}
        self.num_refused = 0   # pieces and writes dropped for want of an open window
        self._inbox: list[Notification] = []
        self._ids = itertools.count(1)

    def register(self, pool: torch.Tensor, aux: torch.Tensor) -> PoolLayout:
        self.layout = PoolLayout.from_tensors(pool, aux)
        self._pool, self._aux = _flat_bytes(pool), _flat_bytes(aux)
        # A numpy view lets CPU pools be sent and filled without an extra copy.
        self._pool_np = self._pool.numpy() if pool.device.type == "cpu" else None
        self._aux_np = self._aux.numpy() if aux.device.type == "cpu" else None
        # The aux slot rides in the last message, so allow for it beyond one chunk.
        self._router.setsockopt(zmq.MAXMSGSIZE, self.config.tcp_chunk_bytes + self.layout.aux_slot_nbytes + (1 << 20))
        return self.layout

    def metadata(self) -> bytes:
        return msgpack.packb({"layout": self.layout.to_wire(), "address": self.address, "name": self.endpoint_name})

    def add_peer(self, metadata: bytes) -> PeerInfo:
        d = msgpack.unpackb(metadata)
        if not isinstance(d, dict) or not isinstance(d.get("address"), str) or not isinstance(d.get("name"), str):
            raise PeerError("tcp peer metadata lacks address or name")
        info = PeerInfo(d["name"], PoolLayout.from_wire(d.get("layout")))
        self.layout.check_peer(info.layout)
        try:
            url, server_key = split_address(d["address"])
        except UnkeyedAddressError as e:
            raise PeerError(f"tcp peer metadata: {e}") from None
        self.remove_peer(info.name)
        sock = as_client(self._ctx.socket(zmq.DEALER), self.config.identity, server_key)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)  # a write queues all its pieces at once; never block the loop
        sock.setsockopt(zmq.MAXMSGSIZE, _MAX_ACK_BYTES)
        sock.setsockopt(zmq.ROUTING_ID, connection_id(self.endpoint_name))
        keep_alive(sock)
        sock.connect(url)
        self._peers[info.name] = _Peer(info, sock)
        return info

    def remove_peer(self, name: str) -> None:
        p = self._peers.pop(name, None)
        if p is None:
            return
        for x in p.xfers:
            out = self._out.get(x)
            if out is not None and out.state == TransferState.TRANSFERRING:
                out.state, out.error = TransferState.FAILED, PeerDisconnectedError(f"peer {name} removed")
        p.sock.close(linger=0)

    def write(self, peer: str, src_blocks: np.ndarray, dst_blocks: np.ndarray,
              src_aux: int | None, dst_aux: int | None, notification: bytes) -> XferId:
        p = self._peers.get(peer)
        if p is None:
            raise PeerError(f"unknown peer {peer!r}")
        xfer = XferId(next(self._ids))
        bn, chunk = self.layout.block_nbytes, self.config.tcp_chunk_bytes
        runs = coalesce_runs(np.asarray(src_blocks), np.asarray(dst_blocks))
        pieces = 0
        try:
            for s, d, k in zip(runs.src_start.tolist(), runs.dst_start.tolist(), runs.length.tolist()):
                for off in range(0, k * bn, chunk):
                    n = min(chunk, k * bn - off)
                    head = msgpack.packb({"v": _VERSION, "x": xfer, "w": self.endpoint_name, "notif": notification,
                                          "off": d * bn + off, "n": n})
                    p.sock.send_multipart([head, self._bytes(self._pool, self._pool_np, s * bn + off, n)],
                                          flags=zmq.NOBLOCK, copy=False)
                    pieces += 1
            an = self.layout.aux_slot_nbytes
            aux: memoryview | bytes
            aux_off, aux = -1, b""  # no aux slot
            if src_aux is not None and dst_aux is not None:
                aux_off, aux = dst_aux * an, self._bytes(self._aux, self._aux_np, src_aux * an, an)
            head = msgpack.packb({"v": _VERSION, "x": xfer, "w": self.endpoint_name, "end": True, "pieces": pieces,
                                  "aux_off": aux_off, "notif": bytes(notification)})
            p.sock.send_multipart([head, aux], flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as e:
            raise TransferError(f"tcp: send to {peer} failed: {e}") from e
        self._out[xfer] = _Out(peer)
        p.xfers.add(xfer)
        return xfer

    def poll(self, xfer: XferId) -> TransferState:
        self._pump()
        out = self._out.get(xfer)
        return out.state if out is not None else TransferState.FAILED

    def failure(self, xfer: XferId) -> KVTransferError | None:
        out = self._out.get(xfer)
        return out.error if out is not None else TransferError(f"unknown transfer {xfer}")

    def release(self, xfer: XferId) -> None:
        # Pieces already queued in ZMQ cannot be recalled; the receiver's room logic ignores them.
        out = self._out.pop(xfer, None)
        if out is not None and out.peer in self._peers:
            self._peers[out.peer].xfers.discard(xfer)

    def open_window(self, peer: str, notification: bytes, blocks: np.ndarray, aux: int | None) -> None:
        self._windows[bytes(notification)] = WriteWindow.of(peer, blocks, aux)

    def close_window(self, notification: bytes) -> None:
        # Pieces still queued in ZMQ are read later and dropped: the check is per piece, on this thread.
        self._windows.pop(bytes(notification), None)

    def transports(self) -> PeerTransport:
        return PeerTransport(("tcp",), None, True, "raypd's tcp backend: ZMQ over the kernel's TCP")

    def notifications(self) -> list[Notification]:
        self._pump()
        out, self._inbox = self._inbox, []
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for name in list(self._peers):
            self.remove_peer(name)
        self._watch.close()
        self._router.close(linger=0)
        unguard(self._ctx)
        self._ctx.term()

    # -- the wire --------------------------------------------------------------------------------
    @staticmethod
    def _bytes(flat: torch.Tensor, flat_np: np.ndarray | None, off: int, n: int) -> memoryview | bytes:
        if flat_np is not None:
            return flat_np[off:off + n].data
        return flat[off:off + n].cpu().numpy().tobytes()  # VRAM: stage through host memory

    def _store(self, flat: torch.Tensor, flat_np: np.ndarray | None, off: int, buf: memoryview) -> None:
        src = np.frombuffer(buf, dtype=np.uint8)
        if flat_np is not None:
            flat_np[off:off + src.size] = src
        else:
            with warnings.catch_warnings():  # a read-only zmq buffer; it is copied at once
                warnings.simplefilter("ignore")
                flat[off:off + src.size].copy_(torch.from_numpy(src))

    def _pump(self) -> None:
        """Apply whatever arrived: data pieces on the router, acknowledgements on the dealers."""
        self._watch.drain()
        while True:
            try:
                frames = self._router.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self._on_data(frames)
        for p in list(self._peers.values()):
            while True:
                try:
                    msg = p.sock.recv(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._on_ack(p, msg)

    def _on_data(self, frames: list[zmq.Frame]) -> None:
        if len(frames) != 3:
            log.error("tcp: dropped a data message of %d frames", len(frames))
            return
        ident, head, body = frames[0].bytes, frames[1].bytes, frames[2].buffer
        principal = sender_of(self._peer_keys, frames[0])
        try:
            h = msgpack.unpackb(head)
            if (not isinstance(h, dict) or h.get("v") != _VERSION or not isinstance(h.get("x"), int)
                    or not isinstance(h.get("notif"), bytes) or not isinstance(h.get("w"), str)):
                raise ValueError(f"bad header {h!r:.200}")
        except Exception as e:
            log.error("tcp: dropped a data message from %s: %s", principal, e)
            return
        writer, notif = cast(str, h["w"]), cast(bytes, h["notif"])
        if principal is None or not owns(principal, writer):
            # Written by another than it says (or by a key no longer admitted): none of its bytes land.
            self._refuse(ident, h, f"{principal or 'a key no longer admitted'} may not write as {writer!r:.100}")
            return
        window = self._windows.get(notif)
        key = (ident, h["x"])  # per connection: the ROUTER's routing id
        st = self._in.get(key)
        if st is None:
            if window is None or window.peer != writer:
                # Not expected (any more): the room was aborted or finished, or this is not its writer.
                # Keep no state for it, so such writes cannot grow memory; answer its last message.
                self._refuse(ident, h, "no open window for this write")
                return
            st = self._in[key] = _In(time.monotonic(), notif)
            self._expire_partial()
        if st.notif != notif:
            st.bad = "the write changed its notification"
        if not h.get("end"):
            off, n = h.get("off"), h.get("n")
            bn = self.layout.block_nbytes
            if not (isinstance(off, int) and isinstance(n, int) and n == len(body) and n > 0
                    and 0 <= off and off + n <= self.layout.num_blocks * bn):
                st.bad = f"piece out of bounds (off={off}, n={n}, got {len(body)} bytes)"
                return
            if window is None or not window.admits(writer, off // bn, (off + n - 1) // bn):
                self.num_refused += 1
                st.bad = "piece outside the write's open window (closed, or not its blocks)"
                return
            if st.bad is None:
                self._store(self._pool, self._pool_np, off, body)
                st.pieces += 1
            return
        del self._in[key]
        aux_off = h.get("aux_off")
        if st.bad is None and st.pieces != h.get("pieces"):
            st.bad = f"{st.pieces} of {h.get('pieces')} pieces arrived"
        if st.bad is None and (window is None or window.peer != writer):
            st.bad = "the write's window closed before it ended"
        if st.bad is None and aux_off != -1:
            an = self.layout.aux_slot_nbytes
            assert window is not None
            if not (isinstance(aux_off, int) and 0 <= aux_off and aux_off + an <= self.layout.aux_slots * an
                    and len(body) == an and aux_off % an == 0):
                st.bad = f"aux slot out of bounds (off={aux_off}, {len(body)} bytes)"
            elif window.aux is None or aux_off != window.aux * an:
                st.bad = "aux slot outside the write's open window"
            else:
                self._store(self._aux, self._aux_np, aux_off, body)
        if st.bad is None:
            self._inbox.append(Notification(writer, notif))
        else:
            log.error("tcp: write %d from %s failed: %s", h["x"], writer, st.bad)
        self._ack(ident, h["x"], st.bad)

    def _refuse(self, ident: bytes, h: dict, why: str) -> None:
        self.num_refused += 1
        log_refusal(self.num_refused, "tcp: dropped data from %r: %s", h.get("w"), why)
        if h.get("end"):
            self._ack(ident, h["x"], why)

    def _ack(self, ident: bytes, x: int, bad: str | None) -> None:
        try:
            self._router.send_multipart([ident, msgpack.packb({"v": _VERSION, "x": x, "ok": bad is None,
                                                                 "error": bad or ""})], flags=zmq.NOBLOCK)
        except zmq.ZMQError as e:  # the writer is gone; it will time out on its own
            log.debug("tcp: ack to %r not sent: %s", ident, e)

    def _expire_partial(self) -> None:
        """Forget writes whose last message never came (the writer died mid-way)."""
        limit = time.monotonic() - self.config.transfer_timeout_s
        for key in [k for k, st in self._in.items() if st.started < limit]:
            log.warning("tcp: write %d from %r never finished; dropped", key[1], key[0])
            del self._in[key]

    def _on_ack(self, p: _Peer, msg: bytes) -> None:
        try:
            a = msgpack.unpackb(msg)
            out = self._out.get(a["x"])
        except Exception as e:
            log.error("tcp: bad acknowledgement from %s: %s", p.info.name, e)
            return
        if out is None or out.state != TransferState.TRANSFERRING:
            return
        p.xfers.discard(a["x"])
        if a.get("ok") is True:
            out.state = TransferState.SUCCESS
        else:
            out.state, out.error = TransferState.FAILED, TransferError(f"tcp: peer rejected the write: {a.get('error')}")
