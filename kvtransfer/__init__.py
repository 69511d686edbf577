"""kvtransfer: moving KV blocks between processes (prefill -> decode). Imports neither engine/ nor Ray.

| module               | one sentence |
|----------------------|--------------|
| base.py              | the transfer contract: TransferState (ordered), TransferBackend, the backend registry |
| config.py            | TransferConfig: backend name, bind host/port, every timeout, poll periods |
| layout.py            | PoolLayout: where a block-major pool and its aux buffer live, checked between peers |
| descriptors.py       | block-id validation and coalescing (src, dst) pairs into contiguous runs |
| nixl_backend.py      | NIXL/UCX WRITEs from prepped strided descriptor tables (DRAM or VRAM) |
| tcp_backend.py       | the same contract over pyzmq, for machines without NIXL |
| fake_backend.py      | in-process torch copies with fault knobs, for unit tests of callers |
| bootstrap_schema.py  | the versioned msgpack messages of the bootstrap channel and the write notification |
| bootstrap_server.py  | the sender's ZMQ ROUTER: validates every message, answers malformed ones with Error |
| bootstrap_client.py  | the receiver's ZMQ DEALER link to one sender: registration state, heartbeat clock |
| rooms.py             | the room lifecycle (diagram there) and the thread-safe RoomTable enforcing it |
| endpoint_loop.py     | the one thread per endpoint that touches its backend and sockets |
| endpoint.py          | what both sides share: backend + rooms + loop, poll/wait/release/stats |
| sender.py            | KVSender (prefill): bootstrap server, destinations, writes, Done/Abort handling |
| receiver.py          | KVReceiver (decode): registration, destinations, notifications, aborts, heartbeats |
| errors.py            | typed errors, all under KVTransferError |
"""
from __future__ import annotations

from raypd.kvtransfer.base import (Notification, PeerInfo, TransferBackend, TransferState, XferId, backend_names,
                             create_backend, register_backend)
from raypd.kvtransfer.config import TransferConfig
from raypd.kvtransfer.endpoint import EndpointStats
from raypd.kvtransfer.errors import (BackendUnavailableError, BlockIdError, KVTransferError, LayoutError,
                               PeerDisconnectedError, PeerError, RoomError, SchemaError, TransferError)
from raypd.kvtransfer.layout import PoolLayout
from raypd.kvtransfer.receiver import KVReceiver
from raypd.kvtransfer.sender import KVSender

__all__ = [
    "BackendUnavailableError", "BlockIdError", "EndpointStats", "KVReceiver", "KVSender", "KVTransferError",
    "LayoutError", "Notification", "PeerDisconnectedError", "PeerError", "PeerInfo", "PoolLayout", "RoomError",
    "SchemaError", "TransferBackend", "TransferConfig", "TransferError", "TransferState", "XferId",
    "backend_names", "create_backend", "register_backend",
]
