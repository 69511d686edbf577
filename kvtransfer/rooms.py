"""Rooms: one per disaggregated request, keyed by a random 63-bit id both sides know, and their lifecycle.

Sender (prefill) room:

    add_room ─> BOOTSTRAPPING ─Destination─> WAITING_FOR_INPUT ─send()─> TRANSFERRING ─Done─> SUCCESS
                   │ bootstrap timeout            │                        │ write failed, transfer timeout
                   └──────────────┬───────────────┴────────────────────────┘ Abort (either side), peer dead
                                  v
                               FAILED   (Abort to the peer; Aborted back once no byte can still land)

Receiver (decode) room:

    add_room ─> BOOTSTRAPPING ─registered, Destination sent─> WAITING_FOR_INPUT ─Sending─> TRANSFERRING
                   │ bootstrap timeout                            │ wait timeout             │ transfer timeout
                   │                                              └─────────┬────────────────┘
                   │                                         (Abort sent; FAILED on Aborted, or after heartbeat_timeout)
                   └───────────> FAILED <─── Abort from the sender, peer dead, registration refused
    notification for the room (bytes + aux landed) ─> SUCCESS, and Done goes back

Rules every transition obeys (enforced here, so no caller can break them):
- States only move forward; FAILED is sticky and overrides everything but SUCCESS.
- A room is terminal for its caller only when none of its bytes can still move: a sender room with a
  write in flight, or a receiver room whose abort the sender has not confirmed, stays non-terminal.
  So a caller may free a room's blocks the moment poll() says FAILED or SUCCESS.
- Every non-terminal state has a deadline; the endpoint loop fails rooms whose deadline passed.
- A room is forgotten only by release() after it is terminal: the caller has then seen the outcome.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from raypd.kvtransfer.base import TransferState, XferId
from raypd.kvtransfer.errors import RoomError

S = TransferState


@dataclass(slots=True)
class Room:
    room: int
    state: TransferState
    deadline: float
    peer: str = ""                     # sender: receiver's name ("" until known); receiver: sender's address
    dst_blocks: np.ndarray | None = None
    dst_aux: int | None = None
    xfer: XferId | None = None         # sender: the backend write while it may still move bytes
    aborting: bool = False             # abort asked; waiting until nothing can still land
    abort_by_peer: bool = False        # sender: the receiver asked (answer Aborted), else we did (send Abort)
    destination_sent: bool = False     # receiver: the sender may know our blocks
    armed: tuple | None = None         # sender: (src blocks, src aux) given before the destination came
    reason: str | None = None
    nbytes: int = 0
    t_added: float = 0.0
    t_armed: float | None = None       # sender: write armed before the destination came
    t_posted: float | None = None      # sender: write posted
    t_landed: float | None = None      # sender: backend reports the bytes at the peer
    t_done: float | None = None        # terminal


class RoomTable:
    """The rooms of one endpoint, shared by the caller's thread and the endpoint loop.

    `cond` guards everything; waiters are woken on every state change.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.cond = threading.Condition(threading.RLock())
        self._rooms: dict[int, Room] = {}

    def add(self, room: int, state: TransferState, timeout: float, **fields) -> Room:
        with self.cond:
            if room in self._rooms:
                raise RoomError(f"room {room} is already in use")
            now = self.clock()
            r = Room(room, state, now + timeout, t_added=now, **fields)
            self._rooms[room] = r
            return r

    def get(self, room: int) -> Room | None:
        return self._rooms.get(room)

    def require(self, room: int) -> Room:
        r = self._rooms.get(room)
        if r is None:
            raise RoomError(f"unknown room {room}")
        return r

    def advance(self, r: Room, state: TransferState, timeout: float | None = None) -> bool:
        """Move r forward to `state` (not FAILED); False if r is terminal, aborting or already there."""
        assert state != S.FAILED, "use fail()"
        with self.cond:
            if r.state.is_terminal or r.aborting or state <= r.state:
                return False
            if state == S.SUCCESS and r.xfer is not None:
                raise AssertionError(f"room {r.room}: SUCCESS with a write still held")
            r.state = state
            now = self.clock()
            if timeout is not None:
                r.deadline = now + timeout
            if state.is_terminal:
                r.t_done = now
            self.cond.notify_all()
            return True

    def fail(self, r: Room, reason: str) -> bool:
        """Make r FAILED unless it is already terminal; refuses (AssertionError) while bytes may move."""
        with self.cond:
            if r.state.is_terminal:
                return False
            assert r.xfer is None, f"room {r.room}: failing with a write in flight"
            r.state, r.reason, r.aborting = S.FAILED, r.reason or reason, False
            r.t_done = self.clock()
            self.cond.notify_all()
            return True

    def mark_aborting(self, r: Room, reason: str, timeout: float, by_peer: bool = False) -> bool:
        with self.cond:
            if r.state.is_terminal or r.aborting:
                return False
            r.aborting, r.reason, r.abort_by_peer = True, reason, by_peer
            r.deadline = self.clock() + timeout
            self.cond.notify_all()
            return True

    def release(self, room: int) -> Room:
        with self.cond:
            r = self.require(room)
            if not r.state.is_terminal:
                raise RoomError(f"room {room} is {r.state.name}; abort it and wait for FAILED before release")
            return self._rooms.pop(room)

    def expired(self) -> list[Room]:
        now = self.clock()
        with self.cond:
            return [r for r in self._rooms.values() if not r.state.is_terminal and r.deadline <= now]

    def live(self) -> Iterator[Room]:
        """Non-terminal rooms (a snapshot, safe to transition while iterating)."""
        with self.cond:
            return iter([r for r in self._rooms.values() if not r.state.is_terminal])

    def wait(self, room: int, until: TransferState, timeout: float) -> TransferState:
        """Block until the room reaches `until` or a terminal state, or timeout; return its state."""
        with self.cond:
            r = self.require(room)
            self.cond.wait_for(lambda: r.state >= until or r.state.is_terminal, timeout=timeout)
            return r.state

    def snapshot(self) -> dict[int, TransferState]:
        with self.cond:
            return {k: r.state for k, r in self._rooms.items()}

    def held_blocks(self) -> int:
        """Destination blocks named by rooms not yet released (the caller still holds them)."""
        with self.cond:
            return sum(0 if r.dst_blocks is None else int(r.dst_blocks.size) for r in self._rooms.values())

    def __len__(self) -> int:
        return len(self._rooms)
