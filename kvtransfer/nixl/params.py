"""What a NIXL backend is created with: the plugin (UCX or LIBFABRIC) and, for UCX, the RDMA devices
of the GPU the endpoint's pool is on, picked from TransferConfig.nixl_devices.

The device map (`raypd serve --nixl-devices`, the chart's nixl.devices):

    ""                              the backend's own choice (UCX: every device it finds)
    "mlx5_0" | "mlx5_0,mlx5_1"      these devices for every node, whatever its GPU
    "0=mlx5_0,1=mlx5_1,*=mlx5_2"    per GPU: GPU 0 uses mlx5_0, GPU 1 mlx5_1; `*` serves a GPU
                                    without an entry and a node on the CPU
    "0=mlx5_0+mlx5_1,1=mlx5_2"      several devices for one GPU, joined by "+"

A spec is per GPU as soon as one entry has "="; then every entry must. Keys are GPU indices as the
machine numbers them (nvidia-smi): the pool's torch device index read through CUDA_VISIBLE_DEVICES,
which Ray sets to the GPU it assigned, so a node on cuda:0 in a process that sees only GPU 3 takes
entry 3. A GPU named there by UUID, or without an entry, falls back to `*`, then to the backend's
choice. In a Kubernetes pod holding one GPU that GPU is index 0 whatever its slot on the host.
The backend's choice is already per GPU for GPU memory: NIXL sets UCX's MAX_HCA_PER_GPU to auto
(unless UCX_MAX_HCA_PER_GPU is set), with which UCX (1.23 in the wheel) registers a GPU's memory only
on the HCAs closest to it; the map pins the devices instead (for a wrong guess, or a pool in host
memory).

Devices are RDMA devices (`ibv_devices`; /sys/class/infiniband), optionally with ":1". Why
no other port and no network interface (eth0, lo): NIXL 1.5.1's UCX plugin reads its devices from
the `device_list` parameter (names joined by ", "), appends ":1" to each and forces UCX_NET_DEVICES
to the result. The `ucx_devices` parameter it advertises in get_plugin_params is never read (a
bogus name there changes nothing, measured), and "lo" in device_list becomes "lo:1", which UCX
refuses, failing the backend. To pick a port other than 1 or a TCP interface, leave the map empty
and set UCX_NET_DEVICES in the environment.

LIBFABRIC takes no device or provider parameter (plugin source, src/plugins/libfabric): it uses the
first of the cxi, efa, tcp, sockets providers it finds (FI_PROVIDER narrows that) and picks the
rails for each registered buffer from the PCIe topology (hwloc), which is per-GPU NIC selection
done by the plugin; so a device map with LIBFABRIC is refused rather than silently ignored. Its
plugin library needs libfabric >= 1.21, hwloc and the CUDA driver (libcuda.so.1) on the host;
without them NIXL lists the plugin but cannot create it.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from raypd.kvtransfer.errors import TransferConfigError

if TYPE_CHECKING:  # TransferConfig validates maps with this module; that needs no torch
    import torch

NIXL_BACKENDS = ("UCX", "LIBFABRIC")
ALL_GPUS = "*"
RDMA_SYSFS = Path("/sys/class/infiniband")

_DEVICE = re.compile(r"^([A-Za-z0-9_.-]+)(:[0-9]+)?$")
_INDEX = re.compile(r"^[0-9]+$")


def _device(spec: str, text: str) -> str:
    m = _DEVICE.match(text.strip())
    if m is None:
        raise TransferConfigError(f"nixl_devices {spec!r}: {text.strip()!r} is not a device name like mlx5_0")
    name, port = m.group(1), m.group(2)
    if port not in (None, ":1"):
        raise TransferConfigError(
            f"nixl_devices {spec!r}: {text.strip()!r}: NIXL's UCX plugin uses port 1 of every device it is "
            "given; for another port leave nixl_devices empty and set UCX_NET_DEVICES")
    return name


@dataclass(frozen=True)
class NicMap:
    """A parsed device map: the devices for each GPU index, and for everything else."""
    default: tuple[str, ...] = ()   # a GPU without an entry, or the CPU; () = the backend's choice
    per_gpu: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> NicMap:
        if not isinstance(spec, str):
            raise TransferConfigError(f"nixl_devices must be a string, got {type(spec).__name__}")
        if not spec.strip():
            return cls()
        entries = [e.strip() for e in spec.split(",")]
        if "" in entries:
            raise TransferConfigError(f"nixl_devices {spec!r}: an empty entry")
        keyed = ["=" in e for e in entries]
        if not any(keyed):
            return cls(default=tuple(_device(spec, e) for e in entries))
        if not all(keyed):
            raise TransferConfigError(f"nixl_devices {spec!r} mixes GPU=DEVICE entries with plain devices; "
                                      f"write a device for every GPU as {ALL_GPUS}=DEVICE")
        default: tuple[str, ...] = ()
        per_gpu: dict[int, tuple[str, ...]] = {}
        seen: set[str] = set()
        for entry in entries:
            key, _, value = (part.strip() for part in entry.partition("="))
            if key in seen:
                raise TransferConfigError(f"nixl_devices {spec!r}: GPU {key} has two entries")
            seen.add(key)
            devices = tuple(_device(spec, d) for d in value.split("+"))
            if key == ALL_GPUS:
                default = devices
            elif _INDEX.match(key):
                per_gpu[int(key)] = devices
            else:
                raise TransferConfigError(f"nixl_devices {spec!r}: {key!r} is neither a GPU index nor {ALL_GPUS}")
        return cls(default, per_gpu)

    def devices_for(self, gpu: int | None) -> tuple[str, ...]:
        """The devices of a machine GPU index (None: a node on the CPU); () = the backend's choice."""
        if gpu is not None and gpu in self.per_gpu:
            return self.per_gpu[gpu]
        return self.default


def machine_gpu_index(device: torch.device, cuda_visible: str | None) -> int | None:
    """The machine's index of the GPU `device` is on: a NicMap key. None on the CPU, and when
    CUDA_VISIBLE_DEVICES names that GPU by UUID (then only the map's `*` entry applies)."""
    if device.type != "cuda":
        return None
    index = device.index or 0
    if not cuda_visible:
        return index
    visible = [v.strip() for v in cuda_visible.split(",")]
    if index >= len(visible) or not _INDEX.match(visible[index]):
        return None
    return int(visible[index])


def rdma_devices(root: Path | None = None) -> list[str]:
    """The RDMA devices of this machine (as `ibv_devices` lists them); empty without an RDMA stack."""
    root = root or RDMA_SYSFS
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def ucx_params(plugin_defaults: Mapping[str, str], devices: tuple[str, ...]) -> dict[str, str]:
    """The UCX backend's init parameters: the plugin's defaults (error handling "peer": a dead peer
    fails its transfers instead of hanging them) and the devices as the plugin reads them."""
    params = {k: v for k, v in plugin_defaults.items() if k != "ucx_devices"}  # advertised, never read
    if devices:
        params["device_list"] = ", ".join(devices)
    return params
