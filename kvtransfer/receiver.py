"""KVReceiver: the decode side. Registers once with each sender it meets, hands over each room's
destination blocks and aux slot, and finishes the room when the sender's write notification arrives.

    receiver = KVReceiver(pool, aux, TransferConfig(backend="nixl"))
    receiver.add_room(room, sender_bootstrap_address, dst_blocks, dst_aux_slot)  # blocks reserved by the caller
    receiver.poll(room) == SUCCESS   # the KV and aux slot are in place: decode from them, release(room)
    receiver.poll(room) == FAILED    # free the reserved blocks, release(room); failure_reason(room) says why

No write lands in a room's blocks once the room is FAILED, so the caller may free or reuse them
the moment poll() says so. How depends on the backend:
- revocable (tcp, fake): the backend admits a room's write only while its window is open; the
  window opens just before the destination goes out and closes when the room succeeds, fails or is
  aborted, on this endpoint's thread, before the room's state changes. An abort is then immediate.
- not revocable (nixl: one-sided writes the receiver cannot refuse): an abort of a room whose
  destination the sender may know waits for the sender's confirmation (Aborted), or for the sender's
  own bound on a write in flight (transfer_timeout_s) plus the time to notice (heartbeat_timeout_s).
  A sender that goes silent is given heartbeat_timeout_s more: by then it has dropped this receiver
  and cancelled its writes (and a sender never posts a write past its room's deadline).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import zmq

from raypd.kvtransfer.base import TransferState
from raypd.kvtransfer.bootstrap import schema
from raypd.kvtransfer.bootstrap.client import BootstrapLink
from raypd.kvtransfer.config import TransferConfig
from raypd.kvtransfer.descriptors import as_block_ids, check_pairs, check_slot
from raypd.kvtransfer.endpoint import Endpoint
from raypd.kvtransfer.identity import owns, split_address
from raypd.kvtransfer.rooms import Room

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
S = TransferState


class KVReceiver(Endpoint):
    role = "decode"

    def __init__(self, pool: torch.Tensor, aux: torch.Tensor, config: TransferConfig | None = None,
                 name: str | None = None):
        super().__init__(pool, aux, config or TransferConfig(), name)
        self._links: dict[str, BootstrapLink] = {}
        self._loop.start()

    # -- caller API -------------------------------------------------------------------------------
    def add_room(self, room: int, sender_address: str, dst_blocks, dst_aux: int | None = None) -> None:
        """Expect the room's KV from the sender at `sender_address` into dst_blocks (reserved by the
        caller until the room is released) and its aux data into slot dst_aux. `sender_address` is
        keyed (identity.py): an address without the sender's key raises UnkeyedAddressError."""
        split_address(sender_address)
        blocks = as_block_ids(dst_blocks, self.layout.num_blocks, "destination block")
        check_pairs(blocks, blocks)
        check_slot(dst_aux, self.layout.aux_slots, "destination aux slot")
        self.rooms.add(room, S.BOOTSTRAPPING, self.config.bootstrap_timeout_s, peer=sender_address,
                       dst_blocks=blocks, dst_aux=dst_aux, nbytes=int(blocks.size) * self.layout.block_nbytes)
        self._loop.submit("room", room)

    def abort(self, room: int, reason: str = "aborted by the receiver") -> None:
        """Give the room up; poll() turns FAILED once the sender confirmed nothing more can land."""
        self.rooms.require(room)
        self._loop.submit("abort", room, reason)

    def links(self) -> list[str]:
        return list(self._links)

    # -- the loop ---------------------------------------------------------------------------------
    def _sockets(self) -> list[zmq.Socket]:
        return [link.socket for link in self._links.values()]

    def _peer_count(self) -> int:
        return len(self._links)

    def _tick(self) -> float:
        for cmd, room, *args in self._loop.commands():
            (self._start_room if cmd == "room" else self._abort_local)(room, *args)
        for address, link in list(self._links.items()):
            msgs = link.receive()
            if msgs:
                link.last_heard = self.rooms.clock()
            for msg in msgs:
                if self._links.get(address) is link:  # a message may have closed it
                    self._on_message(link, msg)
        self._on_notifications()
        self._check_deadlines()
        self._check_heartbeats()
        busy = any(r.state == S.TRANSFERRING for r in self.rooms.live())
        return self._next_wait(busy)

    def _link(self, address: str) -> BootstrapLink:
        link = self._links.get(address)
        if link is None:
            link = BootstrapLink(self._ctx, address, self.name, self.config.max_message_bytes, self.rooms.clock(),
                                 self.config.identity)
            self._links[address] = link
            link.send(schema.Register(self.name, self.backend.name, self.backend.metadata()))
        return link

    def _start_room(self, room: int) -> None:
        r = self.rooms.get(room)
        if r is None or r.state != S.BOOTSTRAPPING or r.aborting:
            return
        link = self._link(r.peer)
        if link.registered:
            self._send_destination(link, r)
        # else: sent when Registered arrives

    def _send_destination(self, link: BootstrapLink, r: Room) -> None:
        with self.rooms.cond:
            if r.state != S.BOOTSTRAPPING or r.aborting or r.destination_sent:
                return
            r.destination_sent = True  # from here on the sender may write: aborts need its confirmation
        assert r.dst_blocks is not None and link.server_name is not None  # set by add_room / Registered
        self.backend.open_window(link.server_name, schema.notification_for(r.room), r.dst_blocks, r.dst_aux)
        link.send(schema.Destination(r.room, r.dst_blocks.tolist(), r.dst_aux))
        self.rooms.advance(r, S.WAITING_FOR_INPUT, self.config.wait_timeout_s)

    def _on_message(self, link: BootstrapLink, msg: schema.Message) -> None:
        if isinstance(msg, schema.Registered):
            if not msg.ok:
                self._health.registration_refused(msg.name or link.address, msg.error)
                self._link_dead(link.address, f"registration refused: {msg.error}")
                return
            if link.server_principal is None or not owns(link.server_principal, msg.name):
                # The key at that address is not one the control plane registered for that name.
                self._link_dead(link.address, f"the sender's key ({link.server_principal or 'not admitted here'}) "
                                              f"does not own the name {msg.name!r}")
                return
            self._health.peer_accepted(msg.name)
            link.registered, link.server_name = True, msg.name
            for r in self.rooms.live():
                if r.peer == link.address:
                    self._send_destination(link, r)
        elif isinstance(msg, schema.Pong):
            if link.registered and (not msg.registered or msg.name != link.server_name):
                self._link_dead(link.address, "the sender restarted or forgot this receiver")
        elif isinstance(msg, schema.Error):
            log.warning("%s: sender %s rejected a message: %s", self.name, link.address, msg.reason)
        elif isinstance(msg, (schema.Sending, schema.Abort, schema.Aborted)):
            room = self.rooms.get(msg.room)
            if room is None or room.peer != link.address or room.state.is_terminal:
                return
            r = room
            if isinstance(msg, schema.Sending):
                self.rooms.advance(r, S.TRANSFERRING, self.config.transfer_timeout_s)
            elif isinstance(msg, schema.Abort):
                # A sender sends Abort only once its write for the room can no longer land.
                self._fail(r, (r.reason or "aborted") if r.aborting else f"aborted by the sender: {msg.reason}")
            elif r.aborting:
                self._fail(r, r.reason or "aborted")
        else:
            log.error("%s: unexpected %s from %s", self.name, type(msg).__name__, link.address)

    def _on_notifications(self) -> None:
        for n in self.backend.notifications():
            room = schema.room_of(n.message)
            r = self.rooms.get(room) if room is not None else None
            link = self._links.get(r.peer) if r is not None else None
            if r is None or link is None or link.server_name != n.peer:
                log.debug("%s: notification %r from %s matches no room", self.name, n.message[:40], n.peer)
                continue
            # While aborting we wait for the sender's word instead: it may have failed the room.
            if r.destination_sent and not r.aborting:
                self.backend.close_window(n.message)  # a second write must not touch blocks now decoding
                if self.rooms.advance(r, S.SUCCESS):
                    link.send(schema.Done(r.room))

    def _abort_local(self, room: int, reason: str) -> None:
        with self.rooms.cond:
            r = self.rooms.get(room)
            if r is None or r.state.is_terminal or r.aborting:
                return
            if not r.destination_sent:
                self._fail(r, reason)
                return
            link = self._links.get(r.peer)
            if self.backend.revocable:
                self._fail(r, reason)  # closes the window: nothing of the room can land from here on
            else:
                self.rooms.mark_aborting(r, reason, self.config.transfer_timeout_s + self.config.heartbeat_timeout_s)
        if link is None or not link.send(schema.Abort(room, reason)):
            self._quarantine_or_fail(r, reason)

    def _check_deadlines(self) -> None:
        for r in self.rooms.expired():
            if r.aborting:
                self._fail(r, f"{r.reason} (the sender never confirmed the abort)")
            elif r.state == S.BOOTSTRAPPING:
                self._fail(r, "bootstrap timeout: could not register with the sender")
            else:
                what = "wait timeout: the sender never started" if r.state == S.WAITING_FOR_INPUT \
                    else "transfer timeout: the write never completed"
                self._abort_local(r.room, what)

    def _fail(self, r: Room, reason: str) -> None:
        """FAILED, with the room's window closed first (on a revocable backend nothing lands after)."""
        self.backend.close_window(schema.notification_for(r.room))
        self.rooms.fail(r, reason)

    def _quarantine_or_fail(self, r: Room, reason: str) -> None:
        """The sender can no longer be asked. Fail the room now unless a write of it may still land
        (destination sent, backend not revocable): then hold it for heartbeat_timeout_s, by when a
        silent sender has dropped us and cancelled its writes."""
        if r.state.is_terminal:
            return
        if not r.destination_sent or self.backend.revocable:
            self._fail(r, reason)
            return
        with self.rooms.cond:
            self.rooms.mark_aborting(r, reason, self.config.heartbeat_timeout_s)
            r.deadline = min(r.deadline, self.rooms.clock() + self.config.heartbeat_timeout_s)

    def _check_heartbeats(self) -> None:
        paused = self._own_pause()
        now = self.rooms.clock()
        for address, link in list(self._links.items()):
            link.last_heard += paused
            if link.last_heard < now - self.config.heartbeat_timeout_s:
                self._link_dead(address, "heartbeat timeout: the sender went silent")
            elif now >= link.next_ping:
                link.seq += 1
                link.send(schema.Ping(link.seq))
                link.next_ping = now + self.config.heartbeat_interval_s

    def _link_dead(self, address: str, reason: str) -> None:
        """Fail every live room behind the link and drop it; the next add_room builds a new one."""
        log.warning("%s: dropping sender %s: %s", self.name, address, reason)
        for r in self.rooms.live():
            if r.peer == address:
                self._quarantine_or_fail(r, f"sender lost: {reason}")
        link = self._links.pop(address, None)
        if link is not None:
            link.close()

    def _shutdown(self) -> None:
        for r in self.rooms.live():
            link = self._links.get(r.peer)
            if link is not None and r.destination_sent:
                link.send(schema.Abort(r.room, "receiver closed"))
            self._fail(r, "receiver closed")

    def _close_sockets(self) -> None:
        for link in self._links.values():
            link.close()
        self._links.clear()
