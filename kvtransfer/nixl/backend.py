"""NixlBackend: one-sided WRITEs through NIXL (UCX or LIBFABRIC): CMA between processes on one CPU host,
cuda_ipc or RDMA for VRAM on GPU hosts; the same code registers either, by the tensors' device.

Backend. TransferConfig.nixl_backend picks the NIXL plugin: UCX (the default) or LIBFABRIC (AWS EFA);
everything below was measured with UCX.
The agent is made at register(), not before: the pool's device is what picks the UCX devices from
the nixl_devices map (params.py), so each GPU's node uses the NICs next to its GPU.

Descriptor tables. Each side's table is prepped once (local at register(), remote at add_peer()) as
two strided rows, so index i < num_blocks is block i and num_blocks + s is aux slot s:

    row 0: (pool_addr, block_nbytes,    dev, stride=block_nbytes,    count=num_blocks)
    row 1: (aux_addr,  aux_slot_nbytes, dev, stride=aux_slot_nbytes, count=aux_slots)

A write is then one make_prepped_xfer over int32 index arrays sorted by destination, which NIXL
merges into one descriptor per run of adjacent blocks (initialize_xfer would not merge), plus the
aux slot. The notification is sent on its own (send_notif) once the write is DONE, so it reaches
the peer after all of it landed, and it goes out through a second agent of ours (the notifier,
named `<endpoint>.notify`, made at the first add_peer) rather than the one that writes. Why:
once a notification (a UCX active message) has gone out on the writing agent's endpoint to a peer,
the next write to that peer does not complete until the peer has next called into NIXL (the
write's flush waits for a round trip through the peer's progress engine), so the prefill's write
completion hung on the decode side's loop. Measured on CMA with the peer progressing every 0.2 ms,
one 720 KiB block: 0.25-0.32 ms median (p90 up to 1.4 ms) with notifications on the writing agent, 0.06 ms (p90
0.07) through the notifier, 0.04-0.15 ms with no notifications at all; with the peer progressing
every 20 ms, 10 ms against 0.15 ms. Attaching the notification to the write was worse still (the
write stayed PROC until the peer had taken it). The receiver sees the notifier's name and
notifications() maps it back to the writing agent's.

Progress. With nixl_progress_thread off (the default) nothing moves unless someone calls into the
agent; the endpoint's loop does, on both sides (the receiver calls notifications() every pass),
which gives notification round trips of tens of microseconds instead of the thread's ~8 ms.
The agent is not thread-safe (sync mode NONE): only that loop calls it after register().

Failures arrive as exceptions from the bindings, not as "ERR": nixlRemoteDisconnectError means the
peer is gone. Local DONE does not prove a live peer consumed the data (a write posted at the
instant of a kill can return DONE), which is why rooms finish on the receiver's acknowledgement.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import torch

from raypd.kvtransfer.base import Notification, PeerInfo, TransferBackend, TransferState, XferId
from raypd.kvtransfer.config import TransferConfig
from raypd.kvtransfer.errors import (
    BackendUnavailableError,
    KVTransferError,
    PeerDisconnectedError,
    PeerError,
    TransferError,
)
from raypd.kvtransfer.layout import PoolLayout
from raypd.kvtransfer.nixl import ucx_transport
from raypd.kvtransfer.nixl.params import NicMap, machine_gpu_index, rdma_devices, ucx_params
from raypd.kvtransfer.nixl.ucx_transport import PeerTransport

log = logging.getLogger(__name__)

_FINISH_SPIN_S = 0.0002  # how long write() keeps progressing a write that transfer() left in flight
_NOTIFIER_SUFFIX = ".notify"


def _load_nixl() -> tuple[Any, Any, Any]:  # nixl ships no type information
    try:
        from nixl import _bindings
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError as e:  # the wheel is missing or its native libraries do not load
        raise BackendUnavailableError(f"the nixl backend needs `pip install nixl`: {e}") from e
    return nixl_agent, nixl_agent_config, _bindings


@dataclass(slots=True)
class _Xfer:
    peer: str
    handle: Any
    state: TransferState
    notification: bytes | None  # sent to the peer when the write is DONE, then None
    error: KVTransferError | None = None


def _agent_name(name: str | bytes) -> str:
    return name.decode() if isinstance(name, bytes) else name  # 1.5.1 returns bytes, notif keys are str


def _writer_of(agent_name: str | bytes) -> str:
    """The writing agent's name for a notification's sender (its notifier agent)."""
    return _agent_name(agent_name).removesuffix(_NOTIFIER_SUFFIX)


def _strided_table(layout: PoolLayout) -> np.ndarray:
    return np.array([[layout.pool_addr, layout.block_nbytes, layout.device_id, layout.block_nbytes, layout.num_blocks],
                     [layout.aux_addr, layout.aux_slot_nbytes, layout.device_id, layout.aux_slot_nbytes, layout.aux_slots]],
                    dtype=np.uint64)


class NixlBackend(TransferBackend):
    name = "nixl"

    def __init__(self, config: TransferConfig, endpoint_name: str):
        super().__init__(config, endpoint_name)
        if config.nixl_backend == "UCX":
            ucx_transport.ask_from_env()  # before nixl loads UCX: it reads its log settings only then
        nixl_agent, nixl_agent_config, bindings = _load_nixl()
        self._disconnect_error = bindings.nixlRemoteDisconnectError
        self._not_found_error = bindings.nixlNotFoundError
        self._nixl_classes = (nixl_agent, nixl_agent_config)
        self._devices: tuple[str, ...] = ()  # UCX devices for the pool's GPU, chosen at register()
        self.agent: Any = None  # made at register(), once the pool's device is known
        self._notifier: Any = None  # the agent that sends notifications; see the module docstring
        self._regs: list[Any] = []
        self._local: Any = None
        self._peers: dict[str, tuple[PeerInfo, Any]] = {}
        self._xfers: dict[XferId, _Xfer] = {}
        self._ids = itertools.count(1)

    def _new_agent(self, name: str) -> Any:
        nixl_agent, nixl_agent_config = self._nixl_classes
        agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=self.config.nixl_progress_thread, backends=[],
                                                   capture_telemetry=False))
        backend = self.config.nixl_backend
        # LIBFABRIC: its plugin's defaults (it takes no devices; params.py). Not get_plugin_params:
        # for a plugin that does not load, that logs a traceback before create_backend says why.
        params = ucx_params(agent.get_plugin_params("UCX"), self._devices) if backend == "UCX" else {}
        try:
            agent.create_backend(backend, params)
        except Exception as e:
            raise BackendUnavailableError(self._creation_failure(backend, e)) from e
        return agent

    def _creation_failure(self, backend: str, e: Exception) -> str:
        why = f"NIXL could not create its {backend} backend ({type(e).__name__}: {e})"
        if isinstance(e, self._not_found_error):  # createBackend: "unsupported backend"
            why += f": its {backend} plugin does not load on this machine"
            if backend == "LIBFABRIC":
                why += " (it needs libfabric >= 1.21, hwloc and the CUDA driver libcuda.so.1); use UCX or install them"
        elif self._devices:
            why += f"; check the devices {', '.join(self._devices)} (ibv_devices, UCX_LOG_LEVEL=warn)"
        return why

    def _choose_devices(self, device: torch.device) -> tuple[str, ...]:
        """The UCX devices of the GPU `device` is on, from the nixl_devices map; each must exist here."""
        nics = NicMap.parse(self.config.nixl_devices)
        gpu = machine_gpu_index(device, os.environ.get("CUDA_VISIBLE_DEVICES"))
        chosen = nics.devices_for(gpu)
        if nics.per_gpu and device.type == "cuda" and gpu not in nics.per_gpu:
            log.warning("nixl: no entry for GPU %s (%s) in nixl_devices %r; using %s", gpu, device,
                        self.config.nixl_devices, ", ".join(chosen) or "every device UCX finds")
        present = rdma_devices()
        missing = [d for d in chosen if d not in present]
        if missing:
            raise BackendUnavailableError(
                f"nixl_devices {self.config.nixl_devices!r} names {', '.join(missing)} for {device}, which this "
                f"machine does not have; its RDMA devices: {', '.join(present) or 'none'}")
        if chosen:
            log.info("nixl: %s on %s (GPU %s) uses %s", self.endpoint_name, device, gpu, ", ".join(chosen))
        return chosen

    def register(self, pool: torch.Tensor, aux: torch.Tensor) -> PoolLayout:
        self.layout = PoolLayout.from_tensors(pool, aux)
        if self.config.nixl_backend == "UCX":
            self._devices = self._choose_devices(pool.device)
        self.agent = self._new_agent(self.endpoint_name)
        self._regs = [self.agent.register_memory(pool), self.agent.register_memory(aux)]
        self._local = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", _strided_table(self.layout), self.layout.mem_type)
        return self.layout

    def metadata(self) -> bytes:
        return msgpack.packb({"layout": self.layout.to_wire(), "agent": self.agent.get_agent_metadata()})

    def add_peer(self, metadata: bytes) -> PeerInfo:
        d = msgpack.unpackb(metadata)
        if not isinstance(d, dict) or not isinstance(d.get("agent"), bytes):
            raise PeerError("nixl peer metadata lacks the agent blob")
        layout = PoolLayout.from_wire(d.get("layout"))
        self.layout.check_peer(layout)
        name = _agent_name(self.agent.add_remote_agent(d["agent"]))
        if name in self._peers:
            # The peer restarted under the same name: drop the stale tables before loading new ones.
            self.remove_peer(name)
            name = _agent_name(self.agent.add_remote_agent(d["agent"]))
        remote = self.agent.prep_xfer_dlist(name, _strided_table(layout), layout.mem_type)
        info = PeerInfo(name, layout)
        self._peers[name] = (info, remote)
        try:
            if self._notifier is None:
                self._notifier = self._new_agent(self.endpoint_name + _NOTIFIER_SUFFIX)
            self._notifier.add_remote_agent(d["agent"])
        except Exception as e:
            self.remove_peer(name)
            raise PeerError(f"nixl: the notifier could not load peer {name}: {e}") from e
        # No make_connection() here: measured on NIXL 1.5.1 (CPU, CMA), a connection made that way left
        # every later write needing milliseconds of extra progress (0.35 ms -> 7 ms for 720 KiB).
        # The first write connects instead; the benchmark keeps that one out of its timings.
        return info

    def remove_peer(self, name: str) -> None:
        for x in self._xfers.values():
            if x.peer == name and x.state == TransferState.TRANSFERRING:
                self._finish(x, PeerDisconnectedError(f"peer {name} removed"))
        entry = self._peers.pop(name, None)
        if entry is None:
            return
        steps = [("release its table", entry[1].release),
                 ("remove the agent", lambda: self.agent.remove_remote_agent(name))]
        if self._notifier is not None:
            steps.append(("remove the notifier's agent", lambda: self._notifier.remove_remote_agent(name)))
        for step, call in steps:
            try:
                call()
            except Exception as e:
                log.warning("nixl: could not %s for peer %s: %s", step, name, e)

    def write(self, peer: str, src_blocks: np.ndarray, dst_blocks: np.ndarray,
              src_aux: int | None, dst_aux: int | None, notification: bytes) -> XferId:
        entry = self._peers.get(peer)
        if entry is None:
            raise PeerError(f"unknown peer {peer!r}")
        info, remote = entry
        order = np.argsort(dst_blocks, kind="stable")
        local_idx, remote_idx = np.asarray(src_blocks)[order], np.asarray(dst_blocks)[order]
        if src_aux is not None and dst_aux is not None:
            local_idx = np.append(local_idx, self.layout.num_blocks + src_aux)
            remote_idx = np.append(remote_idx, info.layout.num_blocks + dst_aux)
        xfer = XferId(next(self._ids))
        try:
            handle = self.agent.make_prepped_xfer("WRITE", self._local, local_idx.astype(np.int32), remote,
                                                  remote_idx.astype(np.int32), b"")
        except Exception as e:
            raise self._classify(e) from e
        x = _Xfer(peer, handle, TransferState.TRANSFERRING, bytes(notification))
        self._xfers[xfer] = x
        try:
            status = self.agent.transfer(handle)  # with CMA the whole copy happens here (GIL released)
            # What is left after transfer() returns needs only progress calls: a few now save the
            # loop's next pass.
            deadline = time.perf_counter() + _FINISH_SPIN_S
            while status == "PROC" and time.perf_counter() < deadline:
                status = self.agent.check_xfer_state(handle)
        except Exception as e:
            self._finish(x, self._classify(e))
            return xfer
        self._apply(x, status)
        return xfer

    def poll(self, xfer: XferId) -> TransferState:
        x = self._xfers.get(xfer)
        if x is None:
            return TransferState.FAILED
        if x.state == TransferState.TRANSFERRING:
            try:
                self._apply(x, self.agent.check_xfer_state(x.handle))
            except Exception as e:
                self._finish(x, self._classify(e))
        return x.state

    def failure(self, xfer: XferId) -> KVTransferError | None:
        x = self._xfers.get(xfer)
        return x.error if x is not None else TransferError(f"unknown transfer {xfer}")

    def release(self, xfer: XferId) -> None:
        x = self._xfers.pop(xfer, None)
        if x is not None and x.handle is not None:
            self._release_handle(x)

    def transports(self) -> PeerTransport:
        """The transports of this endpoint's agent (its put tables in UCX's log: the union over every
        peer it is connected to; the notifier agent sends no puts). Per-peer attribution is not
        possible with one agent per endpoint (ucx_transport.py); the union is what proves that no
        write took a same-machine transport. Off unless RAYPD_UCX_TRANSPORT_REPORT is set."""
        if self.config.nixl_backend != "UCX":
            return PeerTransport.unknown(f"NIXL's {self.config.nixl_backend} plugin prints no protocol table")
        return ucx_transport.writes_of(self.endpoint_name)

    def notifications(self) -> list[Notification]:
        try:
            if self._notifier is not None:
                self._notifier.get_new_notifs()  # only to progress its sends: nothing is sent to it
            notifs = self.agent.get_new_notifs()
        except Exception as e:
            log.warning("nixl: get_new_notifs failed: %s", e)
            return []
        return [Notification(_writer_of(peer), bytes(m)) for peer, msgs in notifs.items() for m in msgs]

    def close(self) -> None:
        if getattr(self, "agent", None) is None:
            return
        # Teardown order: transfer handles, prepped tables, peers, registrations, then the agent.
        for xfer in list(self._xfers):
            self.release(xfer)
        for name in list(self._peers):
            self.remove_peer(name)
        self._notifier = None
        if self._local is not None:
            self._local.release()
            self._local = None
        for reg in self._regs:
            try:
                self.agent.deregister_memory(reg)
            except Exception as e:
                log.warning("nixl: deregister_memory failed: %s", e)
        self._regs = []
        self.agent = None

    # -- helpers ---------------------------------------------------------------------------------
    def _apply(self, x: _Xfer, status: str) -> None:
        if status == "DONE":
            if x.notification is not None:
                msg, x.notification = x.notification, None
                try:
                    self._notifier.send_notif(x.peer, msg)
                except Exception as e:
                    self._finish(x, self._classify(e))
                    return
            x.state = TransferState.SUCCESS
        elif status != "PROC":
            self._finish(x, TransferError(f"nixl reported {status}"))

    def _finish(self, x: _Xfer, error: KVTransferError) -> None:
        x.state, x.error = TransferState.FAILED, error
        self._release_handle(x)

    def _release_handle(self, x: _Xfer) -> None:
        if x.handle is None:
            return
        try:
            x.handle.release()  # cancels the transfer if it is still in flight
        except Exception as e:
            log.warning("nixl: releasing a transfer handle to %s failed: %s", x.peer, e)
        x.handle = None

    def _classify(self, e: Exception) -> KVTransferError:
        if isinstance(e, self._disconnect_error):
            return PeerDisconnectedError(f"nixl: {e}")
        return TransferError(f"nixl: {type(e).__name__}: {e}")
