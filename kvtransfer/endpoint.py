"""Endpoint: what KVSender and KVReceiver share: a registered backend, a RoomTable, an EndpointLoop, the
health its registrations tell (bootstrap/endpoint_health.py) and the caller-facing reads (poll, wait,
release, stats, broken). The two subclasses add their side's protocol.
"""
from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import zmq

from raypd.kvtransfer.base import TransferState, create_backend
from raypd.kvtransfer.bootstrap.endpoint_health import EndpointHealth
from raypd.kvtransfer.config import TransferConfig
from raypd.kvtransfer.data_plane_auth import unguard
from raypd.kvtransfer.endpoint_loop import EndpointLoop
from raypd.kvtransfer.errors import EndpointBrokenError
from raypd.kvtransfer.rooms import Room, RoomTable

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class EndpointStats:
    rooms: int          # rooms not yet released, terminal ones included
    live_rooms: int     # rooms not yet terminal
    held_blocks: int    # destination blocks named by rooms not yet released
    peers: int          # sender: registered receivers; receiver: links to senders


class Endpoint(ABC):
    role = "endpoint"

    def __init__(self, pool: torch.Tensor, aux: torch.Tensor, config: TransferConfig, name: str | None):
        self.config = config
        self.name = name or f"{self.role}-{uuid.uuid4().hex[:16]}"
        # What the host's interfaces say as the backend is made (its UCX worker picks them now).
        self._health = EndpointHealth.now(self.name)
        self.backend = create_backend(config, self.name)
        try:
            self.layout = self.backend.register(pool, aux)
        except Exception:
            self.backend.close()
            raise
        self.rooms = RoomTable()
        self._ctx = zmq.Context()
        self._loop = EndpointLoop(self.name, self._tick, self._sockets, self._shutdown)
        self._closed = False
        self._last_heartbeat_check = self.rooms.clock()

    def _own_pause(self) -> float:
        """Seconds this endpoint itself was not running since the last heartbeat check (a stopped or
        starved process), to excuse from its peers' silence: a node waking from a pause must not call
        its peers dead for a silence it caused. Zero when the gap is within one heartbeat interval."""
        now = self.rooms.clock()
        gap = now - self._last_heartbeat_check
        self._last_heartbeat_check = now
        return gap if gap > self.config.heartbeat_interval_s else 0.0

    def _next_wait(self, busy: bool) -> float:
        """How long the loop may sleep before its next pass: bytes in motion need completions seen at
        once; open rooms need their deadlines and notifications checked; with no room at all only
        heartbeats are due (every interval, far above this), and commands and messages wake the
        loop anyway. Three endpoints idling at idle_poll_s cost ~5% of a core (2% at quiet_poll_s),
        which a flex node's one engine core pays."""
        if busy:
            return self.config.busy_poll_s
        return self.config.idle_poll_s if len(self.rooms) else self.config.quiet_poll_s

    # -- caller API shared by both sides ----------------------------------------------------------
    def poll(self, room: int) -> TransferState:
        """The room's state; FAILED and SUCCESS are final and mean no byte of it can still move."""
        return self.rooms.require(room).state

    def failure_reason(self, room: int) -> str | None:
        return self.rooms.require(room).reason

    def wait(self, room: int, until: TransferState = TransferState.SUCCESS, timeout: float = 60.0) -> TransferState:
        """Block until the room reaches `until` or a final state, or `timeout` passes; its state."""
        return self.rooms.wait(room, until, timeout)

    def release(self, room: int) -> Room:
        """Forget a finished room (FAILED or SUCCESS) and return its record (timings, reason)."""
        return self.rooms.release(room)

    @property
    def broken(self) -> str | None:
        """Why this endpoint's own backend reaches no peer (bootstrap/endpoint_health.py), or None.
        Broken is for good: only a new process mends it. Any thread."""
        return self._health.broken

    def raise_if_broken(self) -> None:
        """EndpointBrokenError when `broken`: the caller's process should end and start anew."""
        if (why := self._health.broken) is not None:
            raise EndpointBrokenError(f"transfer endpoint {self.name} is broken: {why}")

    def stats(self) -> EndpointStats:
        with self.rooms.cond:
            live = sum(1 for _ in self.rooms.live())
            return EndpointStats(len(self.rooms), live, self.rooms.held_blocks(), self._peer_count())

    def close(self) -> None:
        """Stop the loop (live rooms are aborted towards their peers), then free sockets and the backend."""
        if self._closed:
            return
        self._closed = True
        self._loop.stop()
        self._close_sockets()
        self.backend.close()
        unguard(self._ctx)
        self._ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what each side implements ---------------------------------------------------------------------------
    @abstractmethod
    def _tick(self) -> float:
        ...

    @abstractmethod
    def _sockets(self) -> list[zmq.Socket]:
        ...

    @abstractmethod
    def _shutdown(self) -> None:
        ...

    @abstractmethod
    def _close_sockets(self) -> None:
        ...

    @abstractmethod
    def _peer_count(self) -> int:
        ...
