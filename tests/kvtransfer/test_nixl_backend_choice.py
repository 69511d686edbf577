"""NixlBackend creates the NIXL backend TransferConfig names, with the devices of its pool's GPU, on the
real NIXL wheel: UCX by default, LIBFABRIC when asked (created where its plugin loads, refused with a
typed error where it does not), and a device map that cannot apply here refused before NIXL runs."""
from __future__ import annotations

import ctypes.util

import pytest
import torch

from raypd.kvtransfer import BackendUnavailableError, TransferConfig
from raypd.kvtransfer.nixl import params as nixl_params
from raypd.kvtransfer.nixl.backend import NixlBackend


def pool():
    return torch.zeros(4, 64), torch.zeros(2, 4, dtype=torch.int64)


@pytest.fixture
def made():
    backends: list[NixlBackend] = []

    def make(name: str, **options) -> NixlBackend:
        backend = NixlBackend(TransferConfig(**options), name)
        backends.append(backend)
        return backend
    yield make
    for backend in backends:
        backend.close()


def test_default_is_ucx_with_every_device(made):
    backend = made("ucx-default")
    assert backend.agent is None           # made once the pool's device is known
    backend.register(*pool())
    assert list(backend.agent.backends) == ["UCX"]
    params = backend.agent.get_backend_params("UCX")
    assert params["ucx_error_handling_mode"] == "peer"
    assert "device_list" not in params     # UCX's own choice


def test_cpu_node_ignores_the_gpu_entries_of_a_map(made):
    backend = made("ucx-cpu", nixl_devices="0=nosuchdev0,1=nosuchdev1")
    backend.register(*pool())              # the CPU has no entry and there is no `*`: every device
    assert "device_list" not in backend.agent.get_backend_params("UCX")


def test_devices_missing_on_this_machine_are_refused_before_nixl(made):
    backend = made("ucx-missing", nixl_devices="0=mlx5_0,*=nosuchdev9")
    with pytest.raises(BackendUnavailableError, match=r"names nosuchdev9 for cpu, which this machine does not have"):
        backend.register(*pool())
    assert backend.agent is None


def test_the_device_list_reaches_ucx(made, tmp_path, monkeypatch):
    """A device the machine seems to have passes the check and reaches UCX as device_list; UCX then
    refuses it (no such HCA really exists), which shows the list was applied rather than ignored."""
    (tmp_path / "fakehca0").mkdir()
    monkeypatch.setattr(nixl_params, "RDMA_SYSFS", tmp_path)
    backend = made("ucx-applied", nixl_devices="fakehca0")
    with pytest.raises(BackendUnavailableError, match=r"could not create its UCX backend .*check the devices fakehca0"):
        backend.register(*pool())


def _libfabric_can_load() -> bool:
    # The plugin links these (ldd libplugin_LIBFABRIC.so); NIXL lists the plugin either way.
    return all(ctypes.util.find_library(lib) for lib in ("fabric", "hwloc", "cuda"))


def test_libfabric_is_created_where_it_loads_and_refused_with_a_typed_error_elsewhere(made):
    from nixl._api import nixl_agent, nixl_agent_config

    plugins = nixl_agent("probe-plugins", nixl_agent_config(enable_prog_thread=False, backends=[])).get_plugin_list()
    assert "LIBFABRIC" in plugins          # the wheel ships it
    backend = made("lf-node", nixl_backend="LIBFABRIC")
    if _libfabric_can_load():
        backend.register(*pool())
        assert list(backend.agent.backends) == ["LIBFABRIC"]
    else:
        with pytest.raises(BackendUnavailableError,
                           match=r"could not create its LIBFABRIC backend .*does not load on this machine "
                                 r"\(it needs libfabric >= 1\.21, hwloc and the CUDA driver"):
            backend.register(*pool())
