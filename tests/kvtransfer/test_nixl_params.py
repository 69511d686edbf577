"""The NIXL options of TransferConfig: the backend choice and the per-GPU device map, parsed, resolved
for a device, and turned into the UCX plugin's parameters (no NIXL agent here)."""
from __future__ import annotations

import pytest
import torch

from raypd.kvtransfer import KVTransferError, TransferConfig, TransferConfigError
from raypd.kvtransfer.nixl.params import NicMap, machine_gpu_index, rdma_devices, ucx_params


def test_empty_map_leaves_the_choice_to_the_backend():
    nics = NicMap.parse("")
    assert nics == NicMap.parse("  ") == NicMap()
    assert nics.devices_for(0) == nics.devices_for(None) == ()


def test_plain_devices_serve_every_gpu_and_the_cpu():
    nics = NicMap.parse("mlx5_0:1, mlx5_1")
    assert nics.default == ("mlx5_0", "mlx5_1")   # ":1" is the port NIXL uses anyway
    assert nics.per_gpu == {}
    assert nics.devices_for(0) == nics.devices_for(7) == nics.devices_for(None) == ("mlx5_0", "mlx5_1")


def test_per_gpu_map_with_several_devices_and_a_default():
    nics = NicMap.parse("0=mlx5_0,1=mlx5_1+mlx5_3:1,*=mlx5_2")
    assert nics.per_gpu == {0: ("mlx5_0",), 1: ("mlx5_1", "mlx5_3")}
    assert nics.default == ("mlx5_2",)
    assert nics.devices_for(1) == ("mlx5_1", "mlx5_3")
    assert nics.devices_for(5) == ("mlx5_2",)      # a GPU without an entry takes `*`
    assert nics.devices_for(None) == ("mlx5_2",)   # so does the CPU


def test_per_gpu_map_without_default_gives_other_gpus_the_backends_choice():
    nics = NicMap.parse("0=mlx5_0, 1=mlx5_1")
    assert nics.devices_for(0) == ("mlx5_0",)
    assert nics.devices_for(2) == () and nics.devices_for(None) == ()


@pytest.mark.parametrize("spec,message", [
    ("0=mlx5_0,mlx5_1", "mixes GPU=DEVICE entries with plain devices"),
    ("0=mlx5_0,0=mlx5_1", "GPU 0 has two entries"),
    ("gpu0=mlx5_0", "neither a GPU index nor *"),
    ("-1=mlx5_0", "neither a GPU index nor *"),
    ("mlx5_0:2", "uses port 1 of every device"),
    ("0=", "is not a device name"),
    ("0=mlx5_0+", "is not a device name"),
    ("mlx5_0,,mlx5_1", "an empty entry"),
    ("mlx5 0", "is not a device name"),
    ("eth0;mlx5_0", "is not a device name"),
], ids=["mixed", "duplicate", "key", "negative", "port", "empty-device", "trailing-plus", "empty-entry",
        "space", "semicolon"])
def test_malformed_maps_are_typed_errors(spec, message):
    with pytest.raises(TransferConfigError, match=message) as caught:
        NicMap.parse(spec)
    assert isinstance(caught.value, KVTransferError) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize("device,visible,expected", [
    (torch.device("cpu"), "0", None),
    (torch.device("cuda", 1), None, 1),            # no CUDA_VISIBLE_DEVICES: torch's index is the machine's
    (torch.device("cuda", 1), "", 1),
    (torch.device("cuda", 0), "3", 3),             # Ray gave this actor GPU 3: it is cuda:0 here
    (torch.device("cuda", 1), "2, 5", 5),
    (torch.device("cuda", 0), "GPU-8a1e5c3b-0000", None),   # named by UUID: only `*` applies
    (torch.device("cuda", 2), "0,1", None),
], ids=["cpu", "unset", "empty", "ray-one", "ray-two", "uuid", "hidden"])
def test_machine_gpu_index_reads_through_cuda_visible_devices(device, visible, expected):
    assert machine_gpu_index(device, visible) == expected


def test_ucx_params_pass_devices_the_way_the_plugin_reads_them():
    defaults = {"ucx_error_handling_mode": "peer", "num_workers": "1", "ucx_devices": ""}
    assert ucx_params(defaults, ("mlx5_0", "mlx5_1")) == {
        "ucx_error_handling_mode": "peer", "num_workers": "1", "device_list": "mlx5_0, mlx5_1"}
    assert ucx_params(defaults, ()) == {"ucx_error_handling_mode": "peer", "num_workers": "1"}


def test_rdma_devices_lists_the_sysfs_folder(tmp_path):
    for name in ("mlx5_1", "mlx5_0"):
        (tmp_path / name).mkdir()
    assert rdma_devices(tmp_path) == ["mlx5_0", "mlx5_1"]
    assert rdma_devices(tmp_path / "absent") == []


def test_transfer_config_defaults_to_ucx_with_every_device():
    cfg = TransferConfig()
    assert (cfg.nixl_backend, cfg.nixl_devices) == ("UCX", "")
    assert TransferConfig(nixl_backend="LIBFABRIC").nixl_backend == "LIBFABRIC"
    assert TransferConfig(nixl_devices="0=mlx5_0,*=mlx5_1").nixl_devices == "0=mlx5_0,*=mlx5_1"


@pytest.mark.parametrize("options,message", [
    ({"nixl_backend": "ucx"}, "nixl_backend must be one of UCX, LIBFABRIC"),
    ({"nixl_backend": "GDS"}, "nixl_backend must be one of UCX, LIBFABRIC"),
    ({"nixl_backend": "LIBFABRIC", "nixl_devices": "rdmap16s27"}, "applies to UCX only"),
    ({"nixl_devices": "0=mlx5_0,mlx5_1"}, "mixes"),
    ({"nixl_devices": None}, "must be a string"),
    ({"heartbeat_timeout_s": 0.5}, "must exceed heartbeat_interval_s"),
    ({"quiet_poll_s": 1.0}, "quiet_poll_s must be under heartbeat_interval_s"),
], ids=["lowercase", "unknown", "libfabric-devices", "bad-map", "none", "timeouts", "quiet-poll"])
def test_transfer_config_refuses_with_a_typed_error(options, message):
    with pytest.raises(TransferConfigError, match=message):
        TransferConfig(**options)
