"""KVSender: the prefill side. Runs the bootstrap server, learns each room's destination, writes the
room's blocks and aux slot into the receiver's pool, and finishes the room on the receiver's Done.

    sender = KVSender(pool, aux, TransferConfig(backend="nixl"))   # sender.bootstrap_address for peers
    sender.add_room(room)                        # a request arrived here; its destination may follow
    sender.poll(room) >= WAITING_FOR_INPUT       # destination known: sender.destination(room)
    sender.send(room, src_blocks, src_aux_slot)  # after prefill (armed if no destination yet)
    sender.poll(room) == SUCCESS / FAILED        # then free or cache the blocks, and release(room)

Destinations may arrive before add_room (both sides get the request at once); they wait as orphans
for bootstrap_timeout_s and are then aborted towards the receiver so it frees its blocks.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import zmq

from raypd.kvtransfer.base import PeerInfo, TransferState
from raypd.kvtransfer.bootstrap import schema
from raypd.kvtransfer.bootstrap.server import BootstrapServer
from raypd.kvtransfer.config import TransferConfig
from raypd.kvtransfer.data_plane_auth import unguard
from raypd.kvtransfer.descriptors import as_block_ids, check_pairs, check_slot
from raypd.kvtransfer.endpoint import Endpoint
from raypd.kvtransfer.errors import BlockIdError, KVTransferError, PeerDisconnectedError, RoomError
from raypd.kvtransfer.identity import owns
from raypd.kvtransfer.rooms import Room

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
S = TransferState


@dataclass(slots=True)
class _Peer:
    identity: bytes    # the routing id of the connection it registered on (a connection's, not a name)
    info: PeerInfo
    last_heard: float


@dataclass(slots=True)
class _Orphan:
    peer: str
    blocks: np.ndarray
    aux: int | None
    expires: float


class KVSender(Endpoint):
    role = "prefill"

    def __init__(self, pool: torch.Tensor, aux: torch.Tensor, config: TransferConfig | None = None,
                 name: str | None = None):
        super().__init__(pool, aux, config or TransferConfig(), name)
        cfg = self.config
        try:
            self._server = BootstrapServer(self._ctx, cfg.host, cfg.bootstrap_port, cfg.max_message_bytes, cfg.identity)
        except Exception:  # e.g. the configured port is taken
            self.backend.close()
            unguard(self._ctx)
            self._ctx.term()
            raise
        self.bootstrap_address = self._server.address
        self._peers: dict[str, _Peer] = {}
        self._names: dict[bytes, str] = {}       # routing id -> the receiver name registered on it
        self._orphans: dict[int, _Orphan] = {}   # guarded by rooms.cond (add_room reads it)
        self._loop.start()

    # -- caller API -------------------------------------------------------------------------------
    def add_room(self, room: int) -> None:
        with self.rooms.cond:
            orphan = self._orphans.pop(room, None)
            if orphan is None:
                self.rooms.add(room, S.BOOTSTRAPPING, self.config.bootstrap_timeout_s)
                return
            r = self.rooms.add(room, S.BOOTSTRAPPING, self.config.bootstrap_timeout_s, peer=orphan.peer)
            self._accept_destination(r, orphan.blocks, orphan.aux)

    def destination(self, room: int) -> tuple[np.ndarray, int | None] | None:
        """(destination block ids, aux slot) once the receiver sent them, else None."""
        r = self.rooms.require(room)
        return None if r.dst_blocks is None else (r.dst_blocks.copy(), r.dst_aux)

    def send(self, room: int, src_blocks, src_aux: int | None = None) -> None:
        """Write local src_blocks[i] into the destination's block i (and src_aux into its aux slot).
        Called before the destination arrived, the write is armed and posted the moment it does.
        A room that already FAILED (aborted meanwhile) is left as it is: poll() tells."""
        src = as_block_ids(src_blocks, self.layout.num_blocks, "source block")
        check_slot(src_aux, self.layout.aux_slots, "source aux slot")
        with self.rooms.cond:
            r = self.rooms.require(room)
            if r.state == S.FAILED or r.aborting:
                return
            if r.state == S.BOOTSTRAPPING and r.armed is None:
                r.armed = (src, src_aux)
                r.t_armed = self.rooms.clock()
                return
            if r.state != S.WAITING_FOR_INPUT:
                raise RoomError(f"room {room} is {r.state.name}; send() needs WAITING_FOR_INPUT or BOOTSTRAPPING")
            self._start_write(r, src, src_aux)

    def _start_write(self, r: Room, src: np.ndarray, src_aux: int | None) -> None:
        """WAITING_FOR_INPUT -> TRANSFERRING; the loop posts the write (caller holds rooms.cond)."""
        assert r.dst_blocks is not None  # set with WAITING_FOR_INPUT
        check_pairs(src, r.dst_blocks)
        r.nbytes = int(src.size) * self.layout.block_nbytes
        self.rooms.advance(r, S.TRANSFERRING, self.config.transfer_timeout_s)
        self._loop.submit("send", r.room, src, src_aux)

    def abort(self, room: int, reason: str = "aborted by the sender") -> None:
        """Fail the room and tell the receiver; poll() turns FAILED once no byte can still move."""
        self.rooms.require(room)
        self._loop.submit("abort", room, reason)

    def peers(self) -> list[str]:
        return list(self._peers)

    # -- the loop ---------------------------------------------------------------------------------
    def _sockets(self) -> list[zmq.Socket]:
        return [self._server.socket, self._server.watch.socket]

    def _peer_count(self) -> int:
        return len(self._peers)

    def _tick(self) -> float:
        for cmd, room, *args in self._loop.commands():
            (self._post if cmd == "send" else self._abort_local)(room, *args)
        for identity, principal, msg in self._server.receive():
            self._on_message(identity, principal, msg)
        self.backend.notifications()  # nothing is expected here; the call drives backend progress
        busy = self._progress()
        self._check_deadlines()
        self._check_heartbeats()
        return self._next_wait(busy)

    def _on_message(self, identity: bytes, principal: str, msg: schema.Message) -> None:
        if isinstance(msg, schema.Register):
            self._on_register(identity, principal, msg)
            return
        # A receiver is known by the connection it registered on; anything else is unregistered.
        name = self._names.get(identity) or f"<unregistered {principal}>"
        peer = self._peers.get(name)
        if peer is not None and peer.identity != identity:
            peer = None
        if peer is not None:
            peer.last_heard = self.rooms.clock()
        if isinstance(msg, schema.Ping):
            self._server.send(identity, schema.Pong(msg.seq, self.name, peer is not None))
        elif peer is None:
            # Not registered (never, or dropped as dead): refuse room traffic so the receiver frees.
            if isinstance(msg, schema.Destination):
                self._server.send(identity, schema.Abort(msg.room, "receiver is not registered with this sender"))
            elif isinstance(msg, schema.Abort):
                self._server.send(identity, schema.Aborted(msg.room))  # nothing of it here can land
            elif not isinstance(msg, schema.Error):
                log.warning("%s: %s from unregistered %r ignored", self.name, type(msg).__name__, name)
        elif isinstance(msg, schema.Destination):
            self._on_destination(identity, name, msg)
        elif isinstance(msg, schema.Done):
            self._on_done(name, msg.room)
        elif isinstance(msg, schema.Abort):
            self._on_abort(identity, name, msg)
        elif isinstance(msg, schema.Error):
            log.warning("%s: receiver %s rejected a message: %s", self.name, name, msg.reason)
        else:
            log.error("%s: unexpected %s from %s", self.name, type(msg).__name__, name)
            self._server.send(identity, schema.Error(f"unexpected {type(msg).__name__}"))

    def _on_register(self, identity: bytes, principal: str, msg: schema.Register) -> None:
        name = msg.name

        def refuse(why: str, exc_info: bool = False) -> None:
            log.error("%s: refused registration of %s: %s", self.name, name, why, exc_info=exc_info)
            self._server.send(identity, schema.Registered(self.name, False, why[:1000]))

        if not owns(principal, name):  # a registered node may register only under its own names
            return refuse(f"{principal}'s key does not own the name {name!r}")
        if msg.backend != self.backend.name:
            return refuse(f"backend {msg.backend!r} but this sender uses {self.backend.name!r}")
        if name in self._peers:  # the receiver thinks we forgot it: start over
            self._peer_dead(name, "receiver registered again")
        elif len(self._peers) >= self.config.max_peers:
            return refuse(f"this sender already has {len(self._peers)} receivers")
        try:
            info = self.backend.add_peer(msg.metadata)
        except Exception as e:  # bad metadata must not reach the loop
            # A backend made with no network that refuses a peer is broken (bootstrap/endpoint_health.py).
            return refuse(self._health.add_peer_failed(name, e), exc_info=True)   # where in the backend it failed
        self._health.peer_accepted(name)
        if info.name != name:
            self.backend.remove_peer(info.name)
            return refuse(f"metadata names {info.name!r}, not {name!r}")
        self._peers[name] = _Peer(identity, info, self.rooms.clock())
        self._names[identity] = name
        self._server.send(identity, schema.Registered(self.name, True, ""))
        log.info("%s: registered receiver %s", self.name, name)

    def _on_destination(self, identity: bytes, name: str, msg: schema.Destination) -> None:
        layout = self._peers[name].info.layout
        try:
            blocks = as_block_ids(msg.blocks, layout.num_blocks, "destination block")
            check_pairs(blocks, blocks)
            check_slot(msg.aux_slot, layout.aux_slots, "destination aux slot")
        except BlockIdError as e:
            self._server.send(identity, schema.Abort(msg.room, f"bad destination: {e}"))
            return
        with self.rooms.cond:
            r = self.rooms.get(msg.room)
            if r is None:
                if msg.room in self._orphans:
                    log.warning("%s: duplicate destination for room %d ignored", self.name, msg.room)
                elif len(self._orphans) >= self.config.max_orphans:
                    log.warning("%s: %d destinations already wait for their requests; refused room %d from %s",
                                self.name, len(self._orphans), msg.room, name)
                    self._server.send(identity, schema.Abort(msg.room, "too many destinations waiting here"))
                else:
                    self._orphans[msg.room] = _Orphan(name, blocks, msg.aux_slot,
                                                      self.rooms.clock() + self.config.bootstrap_timeout_s)
                return
            if r.state != S.BOOTSTRAPPING or r.aborting or r.peer not in ("", name):
                reason = r.reason or f"room {msg.room} is {r.state.name} here"
                self._server.send(identity, schema.Abort(msg.room, reason))
                return
            r.peer = name
            self._accept_destination(r, blocks, msg.aux_slot)

    def _accept_destination(self, r: Room, blocks: np.ndarray, aux: int | None) -> None:
        r.dst_blocks, r.dst_aux = blocks, aux
        self.rooms.advance(r, S.WAITING_FOR_INPUT, self.config.wait_timeout_s)
        if r.armed is not None:
            (src, src_aux), r.armed = r.armed, None
            try:
                self._start_write(r, src, src_aux)
            except BlockIdError as e:  # the receiver reserved another number of blocks
                self._loop.submit("abort", r.room, f"destination does not fit the armed write: {e}")

    def _on_done(self, name: str, room: int) -> None:
        r = self.rooms.get(room)
        if r is None or r.peer != name or r.state != S.TRANSFERRING or r.aborting:
            return
        if r.xfer is not None:  # Done implies the notification, which implies the bytes: end the write
            self.backend.poll(r.xfer)
            self.backend.release(r.xfer)
            r.xfer = None
            r.t_landed = r.t_landed or self.rooms.clock()
        self.rooms.advance(r, S.SUCCESS)

    def _on_abort(self, identity: bytes, name: str, msg: schema.Abort) -> None:
        with self.rooms.cond:
            orphan = self._orphans.get(msg.room)
            if orphan is not None and orphan.peer == name:
                del self._orphans[msg.room]
            r = self.rooms.get(msg.room)
            if r is not None and r.peer == name and not r.state.is_terminal:
                reason = f"aborted by the receiver: {msg.reason}"
                if r.xfer is not None:  # answer once the write can no longer land (see _progress)
                    self.rooms.mark_aborting(r, reason, self.config.transfer_timeout_s, by_peer=True)
                    return
                self.rooms.fail(r, reason)
        self._server.send(identity, schema.Aborted(msg.room))

    def _post(self, room: int, src: np.ndarray, src_aux: int | None) -> None:
        r = self.rooms.get(room)
        if r is None or r.state != S.TRANSFERRING or r.aborting or r.xfer is not None:
            return
        if r.deadline <= self.rooms.clock():
            # Queued before this process stalled: the receiver may have given the room up and reused its
            # blocks by now. Never write late; the deadline check fails the room and tells the receiver.
            return
        peer = self._peers.get(r.peer)
        if peer is None:
            self.rooms.fail(r, "receiver is gone")
            return
        # Sending first: the receiver switches to fast polling before the notification can arrive.
        self._server.send(peer.identity, schema.Sending(room))
        with_aux = src_aux is not None and r.dst_aux is not None
        assert r.dst_blocks is not None
        r.t_posted = self.rooms.clock()
        try:
            r.xfer = self.backend.write(r.peer, src, r.dst_blocks, src_aux if with_aux else None,
                                        r.dst_aux if with_aux else None, schema.notification_for(room))
            # CMA writes usually finish inside write(): stamp the landing now, not a loop pass later.
            if self.backend.poll(r.xfer) == S.SUCCESS:
                r.t_landed = self.rooms.clock()
        except PeerDisconnectedError as e:
            self._peer_dead(r.peer, str(e))
        except KVTransferError as e:
            self.rooms.fail(r, f"write failed: {e}")
            self._server.send(peer.identity, schema.Abort(room, f"write failed: {e}"))

    def _abort_local(self, room: int, reason: str) -> None:
        with self.rooms.cond:
            r = self.rooms.get(room)
            if r is None or r.state.is_terminal or r.aborting:
                return
            if r.xfer is not None:  # the receiver is told once the write can no longer land
                self.rooms.mark_aborting(r, reason, self.config.transfer_timeout_s)
                return
            self.rooms.fail(r, reason)
        peer = self._peers.get(r.peer)
        if peer is not None:
            self._server.send(peer.identity, schema.Abort(room, reason))

    def _progress(self) -> bool:
        """Advance in-flight writes; True while any may still be moving bytes."""
        busy = False
        dead: dict[str, str] = {}
        for r in self.rooms.live():
            if r.xfer is None:
                continue
            state = self.backend.poll(r.xfer)
            if state == S.TRANSFERRING:
                busy = True
                continue
            err = self.backend.failure(r.xfer) if state == S.FAILED else None
            self.backend.release(r.xfer)
            r.xfer = None
            if state == S.SUCCESS:
                r.t_landed = r.t_landed or self.rooms.clock()
            if r.aborting:
                self._finish_abort(r)
            elif err is not None:
                self.rooms.fail(r, f"write failed: {err}")
                if isinstance(err, PeerDisconnectedError):
                    dead[r.peer] = str(err)
                elif r.peer in self._peers:
                    self._server.send(self._peers[r.peer].identity, schema.Abort(r.room, f"write failed: {err}"))
            # SUCCESS without abort: the room stays TRANSFERRING until the receiver's Done.
        for name, why in dead.items():
            self._peer_dead(name, why)
        return busy

    def _finish_abort(self, r: Room) -> None:
        self.rooms.fail(r, r.reason or "aborted")
        peer = self._peers.get(r.peer)
        if peer is not None:
            msg = schema.Aborted(r.room) if r.abort_by_peer else schema.Abort(r.room, r.reason or "aborted")
            self._server.send(peer.identity, msg)

    def _check_deadlines(self) -> None:
        for r in self.rooms.expired():
            if r.xfer is not None:
                # The write outlived its deadline: cancel it; the receiver learns through Abort.
                log.warning("%s: room %d write still in flight at its deadline; cancelling", self.name, r.room)
                self.backend.release(r.xfer)
                r.xfer = None
            if r.aborting:
                self._finish_abort(r)
                continue
            what = {S.BOOTSTRAPPING: "bootstrap timeout: the destination never arrived",
                    S.WAITING_FOR_INPUT: "wait timeout: send() was never called",
                    S.TRANSFERRING: "transfer timeout: the receiver never acknowledged"}[r.state]
            self.rooms.fail(r, what)
            if r.peer in self._peers:
                self._server.send(self._peers[r.peer].identity, schema.Abort(r.room, what))
        now = self.rooms.clock()
        with self.rooms.cond:
            expired = [(k, o) for k, o in self._orphans.items() if o.expires <= now]
            for k, _ in expired:
                del self._orphans[k]
        for room, o in expired:
            if o.peer in self._peers:
                self._server.send(self._peers[o.peer].identity,
                                  schema.Abort(room, "bootstrap timeout: no request for this room at the sender"))

    def _check_heartbeats(self) -> None:
        paused = self._own_pause()
        for peer in self._peers.values():
            peer.last_heard += paused
        limit = self.rooms.clock() - self.config.heartbeat_timeout_s
        for name in [n for n, p in self._peers.items() if p.last_heard < limit]:
            self._peer_dead(name, "heartbeat timeout: the receiver went silent")

    def _peer_dead(self, name: str, reason: str) -> None:
        """Fail every live room of the peer, forget the peer (and its backend connection)."""
        log.warning("%s: dropping receiver %s: %s", self.name, name, reason)
        for r in self.rooms.live():
            if r.peer != name:
                continue
            if r.xfer is not None:
                self.backend.release(r.xfer)
                r.xfer = None
            self.rooms.fail(r, f"receiver lost: {reason}")
        with self.rooms.cond:
            for k in [k for k, o in self._orphans.items() if o.peer == name]:
                del self._orphans[k]
        peer = self._peers.pop(name, None)
        if peer is not None:
            self._names.pop(peer.identity, None)
        self.backend.remove_peer(name)

    def _shutdown(self) -> None:
        for r in self.rooms.live():
            if r.xfer is not None:
                self.backend.release(r.xfer)
                r.xfer = None
            self.rooms.fail(r, "sender closed")
            if r.peer in self._peers:
                self._server.send(self._peers[r.peer].identity, schema.Abort(r.room, "sender closed"))

    def _close_sockets(self) -> None:
        self._server.close()
