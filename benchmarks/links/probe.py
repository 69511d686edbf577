"""LinkProbe: what `raypd bench links` runs on every Ray node, as a Ray actor pinned there. It owns a KV
pool in host memory (allocated as the engine allocates its pool: engine/cache/host_memory.py) and,
per link it takes part in, an endpoint of that link's own: a KVSender on the writing probe, a
KVReceiver on the other. With the nixl backend each is a fresh NIXL agent whose only peer is the
other end, so that UCX's protocol table for the writing agent names that one peer's transport
(kvtransfer/nixl/ucx_transport.py), and closing the link leaves no peer behind to time out later.

One link, driven by the caller (measure.py), each call bounded by the probe's timeout:

    writer.open_link(name) -> address        a KVSender named `name`, bound to this node's IP
    reader.expect(name, address, rooms)      a KVReceiver reserves every room's blocks at once
    writer.write(name, rooms) -> timings     the rooms in order: add_room, send, wait for SUCCESS
    reader.settle(name, rooms) -> failures   each room SUCCESS (else aborted), released; receiver closed
    writer.close_link(name) -> transport     the sender closed; which transport its writes took

Writes of one link run one at a time, and links one at a time, so the pool is both the source of
this probe's writes and the destination of the others' without two writes ever meeting in it.
"""
from __future__ import annotations

import os
import platform
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raypd.kvtransfer.data_plane_auth import DataPlaneSecret
from raypd.kvtransfer.nixl import ucx_transport
from raypd.kvtransfer.nixl.ucx_transport import PeerTransport

AUX_SLOTS, AUX_BYTES = 1, 64   # the aux slot every real transfer carries beside its blocks


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    backend: str            # "nixl" or "tcp", as `raypd serve --transfer-backend`
    block_bytes: int
    num_blocks: int
    timeout_s: float        # every wait of one link: a destination, a write, a room's end
    nixl_backend: str = "UCX"
    nixl_devices: str = ""


class LinkError(RuntimeError):
    """A link's write did not succeed; the message says at which room and why."""


class LinkProbe:
    def __init__(self, spec: ProbeSpec, secret: DataPlaneSecret):
        # Before kvtransfer loads nixl (and with it UCX): UCX reads its log settings once, on loading.
        self._folder = Path(tempfile.mkdtemp(prefix="raypd-links-"))
        self._tables_refused = ucx_transport.ask_for_tables(self._folder) if spec.backend == "nixl" else None
        # Each link makes two NIXL agents, and NIXL announces every agent at INFO on stdout, which Ray
        # forwards to the driver: four lines per pair, unless asked otherwise.
        os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
        import torch

        from raypd.engine.cache import host_memory
        from raypd.kvtransfer import TransferConfig
        from raypd.node.host import host_info

        self.spec = spec
        self.host = host_info()
        self.pool = host_memory.zeros((spec.num_blocks, spec.block_bytes), torch.uint8)
        self.pool.fill_(1)   # every page touched before any timing
        self.aux = torch.ones((AUX_SLOTS, AUX_BYTES), dtype=torch.uint8)
        t = spec.timeout_s
        # Sockets bind to the node's own IP, as a node's do (node/node_core.py transfer_config).
        self.config = TransferConfig(backend=spec.backend, host=self.host.ip, nixl_backend=spec.nixl_backend,
                                     nixl_devices=spec.nixl_devices, bootstrap_timeout_s=t, wait_timeout_s=t,
                                     transfer_timeout_s=t, heartbeat_timeout_s=max(10.0, t / 2),
                                     identity=secret.shared_identity())
        self.senders: dict[str, Any] = {}     # link name -> KVSender
        self.receivers: dict[str, Any] = {}   # link name -> KVReceiver

    def where(self) -> dict[str, Any]:
        """This probe's machine: its Ray node, address, CPUs and the UCX settings its transfers use."""
        return {"ip": self.host.ip, "node_id": self.host.node_id, "hostname": self.host.hostname,
                "pid": os.getpid(), "cpus": os.cpu_count(), "platform": platform.platform(),
                "ucx_tls": os.environ.get("UCX_TLS"), "ucx_net_devices": os.environ.get("UCX_NET_DEVICES")}

    # -- the writer's side -----------------------------------------------------------------------
    def open_link(self, name: str) -> str:
        from raypd.kvtransfer import KVSender

        self.close_link(name)
        self.senders[name] = KVSender(self.pool, self.aux, self.config, name=name)
        return str(self.senders[name].bootstrap_address)

    def write(self, name: str, rooms: list[tuple[int, int]]) -> list[dict[str, float]]:
        """Write each room's blocks 0..n-1 (and the aux slot) in order; each write's timings."""
        from raypd.kvtransfer import TransferState as S

        sender, t = self.senders[name], self.spec.timeout_s
        out = []
        for room, blocks in rooms:
            sender.add_room(room)
            if sender.wait(room, S.WAITING_FOR_INPUT, t) != S.WAITING_FOR_INPUT:
                raise LinkError(f"room {room}: no destination within {t:g} s: {sender.failure_reason(room)}")
            sender.send(room, np.arange(blocks), 0)
            state = sender.wait(room, S.SUCCESS, t)
            if state != S.SUCCESS:
                raise LinkError(f"room {room} of {blocks} blocks {state.name}: {sender.failure_reason(room)}")
            rec = sender.release(room)
            assert rec.t_posted is not None and rec.t_landed is not None and rec.t_done is not None  # SUCCESS has all
            out.append({"write_s": rec.t_landed - rec.t_posted, "room_s": rec.t_done - rec.t_posted})
        return out

    def close_link(self, name: str) -> dict[str, Any]:
        """Close the link's sender (its live rooms are aborted towards the receiver); the transport its
        writes took, as PeerTransport's fields."""
        sender = self.senders.pop(name, None)
        if sender is None:
            return asdict(PeerTransport.unknown("no such link"))
        sender.close()
        return asdict(self._transport(name))

    def _transport(self, name: str) -> PeerTransport:
        if self.spec.backend == "tcp":
            return PeerTransport(("tcp",), None, True, "raypd's tcp backend: ZMQ over the kernel's TCP")
        if self.spec.nixl_backend != "UCX":
            return PeerTransport.unknown(f"NIXL's {self.spec.nixl_backend} plugin prints no protocol table")
        if self._tables_refused:
            return PeerTransport.unknown(self._tables_refused)
        return ucx_transport.transport_of(ucx_transport.read_logs(self._folder), name)

    # -- the reader's side -----------------------------------------------------------------------
    def expect(self, name: str, address: str, rooms: list[tuple[int, int]]) -> None:
        """A receiver for the link; blocks 0..n-1 and the aux slot of each room reserved for the
        writer at `address`."""
        from raypd.kvtransfer import KVReceiver

        self._close_receiver(name)
        receiver = self.receivers[name] = KVReceiver(self.pool, self.aux, self.config, name=f"{name}-rx")
        for room, blocks in rooms:
            receiver.add_room(room, address, np.arange(blocks), 0)

    def settle(self, name: str, rooms: list[int], wait: bool = True) -> list[str]:
        """Wait for the rooms to succeed (wait=False: the writer failed, give them up at once), abort
        those that did not, release every room that ended, and close the link's receiver; the
        failures, as 'room: reason'. Bounded: one timeout for the waits, one more for the aborts."""
        from raypd.kvtransfer import TransferState as S

        receiver = self.receivers.get(name)
        if receiver is None:
            return ["no receiver for this link"]
        clock = receiver.rooms.clock
        deadline = clock() + (self.spec.timeout_s if wait else 0.0)
        failures = []
        for room in rooms:
            if receiver.wait(room, S.SUCCESS, max(0.0, deadline - clock())) != S.SUCCESS:
                failures.append(f"room {room}: {receiver.failure_reason(room) or 'no write within the timeout'}")
                receiver.abort(room, "raypd bench links gave the room up")
        deadline = clock() + self.spec.timeout_s
        for room in rooms:
            if receiver.wait(room, S.SUCCESS, max(0.0, deadline - clock())).is_terminal:
                receiver.release(room)
        self._close_receiver(name)
        return failures

    def _close_receiver(self, name: str) -> None:
        receiver = self.receivers.pop(name, None)
        if receiver is not None:
            receiver.close()

    def close(self) -> None:
        for name in list(self.senders):
            self.senders.pop(name).close()
        for name in list(self.receivers):
            self._close_receiver(name)
        shutil.rmtree(self._folder, ignore_errors=True)
