"""The transfer contract: TransferState, the TransferBackend base class, and the registry of backends.

A backend moves whole KV blocks (and one aux slot) from this process's registered pool into a
peer's registered pool and tells the peer with a notification once all bytes have landed. It knows
nothing of rooms, handshakes or timeouts: KVSender and KVReceiver build those on top.

Backends are not thread-safe: one thread (an endpoint's loop) makes every call after register().
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, NewType

import numpy as np

from raypd.kvtransfer.config import TransferConfig
from raypd.kvtransfer.errors import BackendUnavailableError, KVTransferError
from raypd.kvtransfer.layout import PoolLayout
from raypd.kvtransfer.nixl.ucx_transport import PeerTransport

if TYPE_CHECKING:
    import torch

XferId = NewType("XferId", int)


class TransferState(IntEnum):
    """Ordered so that the slowest of several parts is their MIN, and 'finished' is a comparison.

    FAILED is lowest on purpose: one failed part makes the whole failed.
    """
    FAILED = 0
    BOOTSTRAPPING = 1       # the two sides have not yet agreed on a destination
    WAITING_FOR_INPUT = 2   # destination known; the sender has not started writing
    TRANSFERRING = 3        # bytes are moving or their arrival is not yet acknowledged
    SUCCESS = 4             # every byte and the aux slot landed and the receiver said so

    @property
    def is_terminal(self) -> bool:
        return self in (TransferState.FAILED, TransferState.SUCCESS)


@dataclass(frozen=True, slots=True)
class Notification:
    peer: str      # the sending endpoint's name (NIXL agent name / tcp identity), always str
    message: bytes


@dataclass(frozen=True, slots=True)
class PeerInfo:
    name: str
    layout: PoolLayout


@dataclass(frozen=True, slots=True)
class WriteWindow:
    """Where one expected write may land, as a revocable backend's receiving side checks it."""
    peer: str                  # the writer's endpoint name
    blocks: frozenset[int]
    aux: int | None

    @classmethod
    def of(cls, peer: str, blocks: np.ndarray, aux: int | None) -> WriteWindow:
        return cls(peer, frozenset(int(b) for b in np.asarray(blocks).tolist()), aux)

    def admits(self, peer: str, first_block: int, last_block: int) -> bool:
        return peer == self.peer and all(b in self.blocks for b in range(first_block, last_block + 1))


class TransferBackend(ABC):
    """Moves blocks between registered pools of two processes. Subclasses set `name` and register.

    Lifecycle: __init__ -> register(pool, aux) once -> metadata() goes to peers over the bootstrap
    channel -> add_peer(their metadata) on the writing side -> write / poll / release on the writing
    side; open_window / notifications / close_window on the receiving side -> remove_peer -> close.
    """

    name: str = ""
    layout: PoolLayout  # set by register()
    # True when close_window() guarantees that no byte of that write lands afterwards (the receiver
    # checks every piece: tcp, fake). False for one-sided writes the receiver cannot refuse (nixl's
    # RDMA): a receiver then frees an aborted room's blocks only once the sender confirmed or its
    # bound on a write in flight has passed (receiver.py).
    revocable: bool = False

    def __init__(self, config: TransferConfig, endpoint_name: str):
        self.config = config
        self.endpoint_name = endpoint_name

    @abstractmethod
    def register(self, pool: torch.Tensor, aux: torch.Tensor) -> PoolLayout:
        """Register the whole block-major pool and the aux buffer (same device) once; prepare the
        local descriptor tables so that a later write costs O(runs), not per-block Python work.
        The tensors must outlive the backend."""

    @abstractmethod
    def metadata(self) -> bytes:
        """Opaque bytes a peer passes to add_peer: how to reach this endpoint and its PoolLayout."""

    @abstractmethod
    def add_peer(self, metadata: bytes) -> PeerInfo:
        """Load a peer's metadata so this endpoint can write into its pool. Adding a name that is
        already known replaces it (a restarted peer must be removed and re-added, never reused)."""

    @abstractmethod
    def remove_peer(self, name: str) -> None:
        """Forget a peer: its in-flight writes end FAILED, its descriptors and connection go. Unknown
        names are ignored."""

    @abstractmethod
    def write(self, peer: str, src_blocks: np.ndarray, dst_blocks: np.ndarray,
              src_aux: int | None, dst_aux: int | None, notification: bytes) -> XferId:
        """Post one write: local src_blocks[i] -> the peer's dst_blocks[i], and the aux slot if both
        are given. `notification` reaches the peer's notifications() only after all bytes landed.
        Ids are validated by the caller. Raises PeerError, PeerDisconnectedError or TransferError."""

    @abstractmethod
    def poll(self, xfer: XferId) -> TransferState:
        """TRANSFERRING, SUCCESS (local completion: the bytes are at the peer) or FAILED. Never raises
        for a transfer failure; failure(xfer) says why."""

    @abstractmethod
    def failure(self, xfer: XferId) -> KVTransferError | None:
        """Why a FAILED write failed (a PeerDisconnectedError means the peer is gone)."""

    @abstractmethod
    def release(self, xfer: XferId) -> None:
        """Free the write's resources, cancelling it if it is still in flight."""

    # Not abstract: a backend that cannot refuse writes has nothing to do here (noqa: B027).
    def open_window(self, peer: str, notification: bytes, blocks: np.ndarray, aux: int | None) -> None:  # noqa: B027
        """Receiving side: the write that `peer` tags with `notification` may now land in these blocks
        and aux slot, and nowhere else. A revocable backend drops any other write."""

    def close_window(self, notification: bytes) -> None:  # noqa: B027
        """Receiving side: once this returns, no byte of the write tagged `notification` lands (when
        `revocable`). Unknown notifications are ignored."""

    def transports(self) -> PeerTransport:
        """Which transports this endpoint's writes have taken so far, all its peers together (nixl:
        UCX's protocol tables, when RAYPD_UCX_TRANSPORT_REPORT is on; nixl/ucx_transport.py says why
        no finer), or unknown with the reason. The one call any thread may make at any time: it
        reads no state the endpoint's loop changes, and it is cheap enough for every stats read."""
        return PeerTransport.unknown(f"the {self.name} backend does not say which transports it uses")

    @abstractmethod
    def notifications(self) -> list[Notification]:
        """Notifications of writes into this endpoint that completed since the last call. Calling this
        is also what makes progress when the backend has no thread of its own, on both sides (nixl:
        the writer's notifications go out only then; poll() advances just the write it polls)."""

    @abstractmethod
    def close(self) -> None:
        """Release everything: handles, peers, registrations. Idempotent."""


# name -> "module:Class"; modules load on first use, so `nixl` is imported only by those who ask.
_REGISTRY: dict[str, str | type[TransferBackend]] = {
    "nixl": "raypd.kvtransfer.nixl.backend:NixlBackend",
    "tcp": "raypd.kvtransfer.tcp_backend:TcpBackend",
    "fake": "raypd.kvtransfer.fake_backend:FakeBackend",
}


def register_backend(name: str, cls: str | type[TransferBackend]) -> None:
    _REGISTRY[name] = cls


def backend_names() -> list[str]:
    return sorted(_REGISTRY)


def create_backend(config: TransferConfig, endpoint_name: str) -> TransferBackend:
    target = _REGISTRY.get(config.backend)
    if target is None:
        raise BackendUnavailableError(f"unknown transfer backend {config.backend!r}; known: {backend_names()}")
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(importlib.import_module(module), attr)
    return target(config, endpoint_name)
