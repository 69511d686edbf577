"""FakeBackend: endpoints in one process write into each other's pools with torch copies.

For unit tests of callers (queues, rooms, the bootstrap protocol) without NIXL or sockets. Knobs
make it misbehave on purpose: `fail_writes` fails every post, `hold_writes` keeps writes in
TRANSFERRING until `complete_held()`, `drop_notifications` loses them, `unrecallable_writes` lets
held writes land even after release() (as tcp pieces already queued in ZMQ do), `unreachable` plays
a UCX worker made while its host's link was down (add_peer raises here, and at any peer that loads
this backend's metadata). Like tcp it is revocable: a write lands only inside the receiver's open
window for it (set `revocable = False` on the receiving instance to model nixl's one-sided writes,
which land regardless).
"""
from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable

import msgpack
import numpy as np
import torch

from raypd.kvtransfer.base import Notification, PeerInfo, TransferBackend, TransferState, WriteWindow, XferId
from raypd.kvtransfer.config import TransferConfig
from raypd.kvtransfer.errors import KVTransferError, PeerDisconnectedError, PeerError, TransferError
from raypd.kvtransfer.layout import PoolLayout

_FABRIC: weakref.WeakValueDictionary[str, FakeBackend] = weakref.WeakValueDictionary()
_ids = itertools.count(1)


class FakeBackend(TransferBackend):
    name = "fake"
    revocable = True
    pool: torch.Tensor  # set by register(), like layout
    aux: torch.Tensor

    def __init__(self, config: TransferConfig, endpoint_name: str):
        super().__init__(config, endpoint_name)
        self.fail_writes = False
        self.hold_writes = False
        self.drop_notifications = False
        self.unrecallable_writes = False
        self.unreachable = False  # set before metadata() goes out for a peer to see it
        self._peers: dict[str, PeerInfo] = {}
        self._xfers: dict[XferId, tuple[TransferState, str, KVTransferError | None]] = {}
        self._held: list[tuple[XferId, Callable[[], None]]] = []
        self._inbox: list[Notification] = []
        self._windows: dict[bytes, WriteWindow] = {}
        self.num_refused = 0   # writes dropped for want of an open window
        _FABRIC[endpoint_name] = self

    def register(self, pool: torch.Tensor, aux: torch.Tensor) -> PoolLayout:
        self.pool, self.aux = pool, aux
        self.layout = PoolLayout.from_tensors(pool, aux)
        return self.layout

    def metadata(self) -> bytes:
        return msgpack.packb({"name": self.endpoint_name, "layout": self.layout.to_wire(),
                              "unreachable": self.unreachable})

    def add_peer(self, metadata: bytes) -> PeerInfo:
        d = msgpack.unpackb(metadata)
        if self.unreachable or d.get("unreachable"):
            who = self.endpoint_name if self.unreachable else d["name"]
            raise TransferError(f"fake backend: {who} is unreachable (made while its link was down)")
        info = PeerInfo(d["name"], PoolLayout.from_wire(d["layout"]))
        self.layout.check_peer(info.layout)
        self._peers[info.name] = info
        return info

    def remove_peer(self, name: str) -> None:
        self._peers.pop(name, None)
        for x, (state, peer, _) in list(self._xfers.items()):
            if peer == name and state == TransferState.TRANSFERRING:
                self._xfers[x] = (TransferState.FAILED, peer, PeerDisconnectedError(f"peer {name} removed"))
        self._held = [(x, f) for x, f in self._held if self._xfers[x][0] == TransferState.TRANSFERRING]

    def write(self, peer: str, src_blocks: np.ndarray, dst_blocks: np.ndarray,
              src_aux: int | None, dst_aux: int | None, notification: bytes) -> XferId:
        if peer not in self._peers:
            raise PeerError(f"unknown peer {peer!r}")
        if self.fail_writes:
            raise TransferError("fake backend: fail_writes is set")
        target = _FABRIC.get(peer)
        if target is None:
            raise PeerDisconnectedError(f"peer {peer!r} is gone")
        xfer = XferId(next(_ids))

        def land() -> None:
            if not target.admits(self.endpoint_name, bytes(notification), dst_blocks, dst_aux):
                target.num_refused += 1
                if xfer in self._xfers:  # not released meanwhile
                    self._xfers[xfer] = (TransferState.FAILED, peer, TransferError("the receiver has no window for it"))
                return
            src = torch.as_tensor(np.asarray(src_blocks), device=self.pool.device)
            dst = torch.as_tensor(np.asarray(dst_blocks), device=target.pool.device)
            target.pool.index_copy_(0, dst, self.pool.index_select(0, src).to(target.pool.device))
            if src_aux is not None and dst_aux is not None:
                target.aux[dst_aux].copy_(self.aux[src_aux])
            if not target.drop_notifications:
                target._inbox.append(Notification(self.endpoint_name, bytes(notification)))
            if xfer in self._xfers:
                self._xfers[xfer] = (TransferState.SUCCESS, peer, None)

        self._xfers[xfer] = (TransferState.TRANSFERRING, peer, None)
        if self.hold_writes:
            self._held.append((xfer, land))
        else:
            land()
        return xfer

    def open_window(self, peer: str, notification: bytes, blocks: np.ndarray, aux: int | None) -> None:
        self._windows[bytes(notification)] = WriteWindow.of(peer, blocks, aux)

    def close_window(self, notification: bytes) -> None:
        self._windows.pop(bytes(notification), None)

    def admits(self, writer: str, notification: bytes, blocks: np.ndarray, aux: int | None) -> bool:
        if not self.revocable:
            return True
        w = self._windows.get(notification)
        return (w is not None and w.peer == writer and all(int(b) in w.blocks for b in np.asarray(blocks).tolist())
                and (aux is None or aux == w.aux))

    @property
    def num_held(self) -> int:
        """Writes posted and held now (`hold_writes`): a test waits for its write to be posted."""
        return len(self._held)

    def complete_held(self) -> int:
        held, self._held = self._held, []
        for _, land in held:
            land()
        return len(held)

    def poll(self, xfer: XferId) -> TransferState:
        return self._xfers[xfer][0] if xfer in self._xfers else TransferState.FAILED

    def failure(self, xfer: XferId) -> KVTransferError | None:
        return self._xfers[xfer][2] if xfer in self._xfers else TransferError(f"unknown transfer {xfer}")

    def release(self, xfer: XferId) -> None:
        self._xfers.pop(xfer, None)
        if not self.unrecallable_writes:
            self._held = [(x, f) for x, f in self._held if x != xfer]

    def notifications(self) -> list[Notification]:
        out, self._inbox = self._inbox, []
        return out

    def close(self) -> None:
        self._peers.clear()
        self._xfers.clear()
        self._held.clear()
        _FABRIC.pop(self.endpoint_name, None)
