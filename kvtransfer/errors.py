"""Typed errors of the transfer layer; callers catch KVTransferError and map it to their own surface."""
from __future__ import annotations


class KVTransferError(Exception):
    """Base class of every error kvtransfer raises on purpose."""


class BackendUnavailableError(KVTransferError):
    """The named backend is unknown, or its library (e.g. nixl) is not installed on this machine."""


class TransferConfigError(KVTransferError, ValueError):
    """A TransferConfig option out of range or inconsistent (an unknown NIXL backend, a bad device map)."""


class LayoutError(KVTransferError, ValueError):
    """A pool or aux tensor cannot be registered, or two endpoints' layouts do not match."""


class BlockIdError(KVTransferError, ValueError):
    """Block ids or an aux slot out of range, duplicated destinations, or lists of unequal length."""


class SchemaError(KVTransferError, ValueError):
    """A bootstrap message that is malformed, of an unknown type or of another schema version."""


class RoomError(KVTransferError):
    """A room id that is unknown, already in use, or asked to do something its state does not allow."""


class PeerError(KVTransferError):
    """An operation named a peer this endpoint does not know (never added, or removed)."""


class TransferError(KVTransferError):
    """A write failed in the backend."""


class PeerDisconnectedError(TransferError):
    """The peer's process or connection is gone; every later write to it fails too until it is re-added."""


class EndpointBrokenError(KVTransferError):
    """This endpoint's own backend reaches no peer (bootstrap/endpoint_health.py): only a new process,
    with a new backend, serves again."""
