"""Moving KV blocks between processes (prefill -> decode) over NIXL or TCP; map in docs/architecture.md."""
from __future__ import annotations

from raypd.kvtransfer.base import (
                             Notification,
                             PeerInfo,
                             TransferBackend,
                             TransferState,
                             XferId,
                             backend_names,
                             create_backend,
                             register_backend,
)
from raypd.kvtransfer.config import TransferConfig
from raypd.kvtransfer.endpoint import EndpointStats
from raypd.kvtransfer.errors import (
                             BackendUnavailableError,
                             BlockIdError,
                             EndpointBrokenError,
                             KVTransferError,
                             LayoutError,
                             PeerDisconnectedError,
                             PeerError,
                             RoomError,
                             SchemaError,
                             TransferConfigError,
                             TransferError,
)
from raypd.kvtransfer.layout import PoolLayout
from raypd.kvtransfer.receiver import KVReceiver
from raypd.kvtransfer.sender import KVSender

__all__ = [
    "BackendUnavailableError", "BlockIdError", "EndpointBrokenError", "EndpointStats", "KVReceiver", "KVSender",
    "KVTransferError", "LayoutError", "Notification", "PeerDisconnectedError", "PeerError", "PeerInfo", "PoolLayout",
    "RoomError", "SchemaError", "TransferBackend", "TransferConfig", "TransferConfigError", "TransferError",
    "TransferState", "XferId", "backend_names", "create_backend", "register_backend",
]
