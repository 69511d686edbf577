"""TransferConfig: the frozen options of one transfer endpoint, every timeout among them."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from raypd.kvtransfer.data_plane_auth import process_identity
from raypd.kvtransfer.errors import TransferConfigError
from raypd.kvtransfer.identity import DataPlaneIdentity
from raypd.kvtransfer.nixl.params import NIXL_BACKENDS, NicMap


@dataclass(frozen=True)
class TransferConfig:
    backend: str = "nixl"
    # Where this endpoint's own sockets bind (the bootstrap server, the tcp backend's data socket).
    host: str = "127.0.0.1"
    # 0 binds an ephemeral port; read it back from KVSender.bootstrap_address.
    bootstrap_port: int = 0
    # Sender: after add_room, the destination must arrive within this. Receiver: registration with the
    # prefill peer must complete and the destination be handed over within this.
    bootstrap_timeout_s: float = 30.0
    # Receiver: after the destination is handed over, the prefill must start writing within this. It
    # covers the prefill's queueing and compute, hence long; a live prefill aborts rooms it drops.
    wait_timeout_s: float = 300.0
    # From write posted (sender) / SENDING seen (receiver) to the receiver's acknowledgement.
    transfer_timeout_s: float = 30.0
    heartbeat_interval_s: float = 1.0
    # Silence after which a peer is dead; also how long an abort waits for the peer's confirmation.
    heartbeat_timeout_s: float = 5.0
    # The endpoint thread's poll period while bytes are in motion, while rooms are open but idle,
    # and while it holds no room at all (heartbeats are then all that is due).
    busy_poll_s: float = 0.0002
    idle_poll_s: float = 0.005
    quiet_poll_s: float = 0.05
    # NIXL's own progress thread costs ~8 ms per notification (it sleeps in poll() >= 1 ms); without
    # it our endpoint thread drives UCX (see nixl/backend.py).
    nixl_progress_thread: bool = False
    # The NIXL plugin that moves the bytes: "UCX" (InfiniBand/RoCE verbs, cuda_ipc, CMA, TCP) or
    # "LIBFABRIC" (AWS EFA, HPE Slingshot; needs libfabric on the host). See nixl/params.py.
    nixl_backend: str = "UCX"
    # UCX only: the RDMA devices per GPU, e.g. "mlx5_0" for every node or "0=mlx5_0,1=mlx5_1,*=mlx5_0"
    # (format in nixl/params.py); "" = every device UCX finds.
    nixl_devices: str = ""
    # tcp backend: bytes per data message (a run of blocks is split into pieces of at most this).
    tcp_chunk_bytes: int = 4 << 20
    # Largest bootstrap message accepted; a bigger one is dropped by ZMQ before it is decoded.
    max_message_bytes: int = 16 << 20
    # Whose keys this endpoint's bootstrap and tcp data sockets use, and whom they admit (ZMQ CURVE,
    # identity.py); the default talks only inside this process. Never logged.
    identity: DataPlaneIdentity = field(default_factory=process_identity, repr=False, compare=False)
    # Sender: destinations that arrived before their request (each holds a receiver's blocks until it
    # expires) and registered receivers; beyond these a newcomer is refused, so memory stays bounded.
    max_orphans: int = 4096
    max_peers: int = 256

    def __post_init__(self) -> None:
        for name in ("bootstrap_timeout_s", "wait_timeout_s", "transfer_timeout_s", "heartbeat_interval_s",
                     "heartbeat_timeout_s", "busy_poll_s", "idle_poll_s", "quiet_poll_s"):
            if not getattr(self, name) > 0:
                raise TransferConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise TransferConfigError("heartbeat_timeout_s must exceed heartbeat_interval_s")
        if self.quiet_poll_s >= self.heartbeat_interval_s:
            raise TransferConfigError("quiet_poll_s must be under heartbeat_interval_s: a quiet endpoint still beats")
        if not 0 <= self.bootstrap_port < 65536:
            raise TransferConfigError(f"bootstrap_port out of range: {self.bootstrap_port}")
        if self.tcp_chunk_bytes < 4096 or self.max_message_bytes < 4096:
            raise TransferConfigError("tcp_chunk_bytes and max_message_bytes must be >= 4096")
        if self.max_orphans < 1 or self.max_peers < 1:
            raise TransferConfigError("max_orphans and max_peers must be >= 1")
        if not isinstance(self.identity, DataPlaneIdentity):
            raise TypeError(f"identity must be a DataPlaneIdentity, got {type(self.identity).__name__}")
        if self.nixl_backend not in NIXL_BACKENDS:
            raise TransferConfigError(
                f"nixl_backend must be one of {', '.join(NIXL_BACKENDS)}, got {self.nixl_backend!r}")
        NicMap.parse(self.nixl_devices)  # raises on a malformed map
        if self.nixl_backend == "LIBFABRIC" and self.nixl_devices.strip():
            raise TransferConfigError("nixl_devices applies to UCX only: LIBFABRIC picks the devices for each GPU "
                                      "from the PCIe topology itself; leave nixl_devices empty")

    def with_(self, **changes) -> TransferConfig:
        return replace(self, **changes)
