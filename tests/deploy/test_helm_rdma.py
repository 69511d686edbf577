"""The chart's data plane and engine values: RDMA device resources, IPC_LOCK, a memory-backed
/dev/shm and host networking on the worker pods; the NIXL backend and device map, and the engine
options, as app args the app builder accepts; every one bounded by the values schema."""
from __future__ import annotations

import json
import re
import typing

import helm_python
import pytest

from raypd.cluster.serve.config import ServeConfig
from raypd.kvtransfer import TransferConfig
from raypd.kvtransfer.nixl.params import NIXL_BACKENDS, NicMap
from tests.deploy import crd_schema
from tests.deploy.chart_values import EFA, MIXED, RDMA
from tests.deploy.conftest import CHART

SCHEMA = json.loads((CHART / "values.schema.json").read_text())


def worker_specs(r) -> list[dict]:
    return [g["template"]["spec"] for g in r.cluster["workerGroupSpecs"]]


def dshm(spec: dict) -> tuple[dict | None, dict | None]:
    """The pod's /dev/shm volume and its container's mount (None, None when absent)."""
    volumes = [v for v in spec.get("volumes", []) if v["name"] == "dshm"]
    mounts = [m for m in spec["containers"][0].get("volumeMounts", []) if m["name"] == "dshm"]
    return (volumes or [None])[0], (mounts or [None])[0]


def test_defaults_leave_the_pods_as_before_and_pick_ucx(render):
    r = render()
    for spec in worker_specs(r) + [r.head["template"]["spec"]]:
        (c,) = spec["containers"]
        assert "securityContext" not in c
        assert "hostNetwork" not in spec and "dnsPolicy" not in spec
        assert dshm(spec) == (None, None)
        assert set(c["resources"]["limits"]) <= {"cpu", "memory", "nvidia.com/gpu"}
    assert r.app_args["transfer_options"] == {"nixl_backend": "UCX"}
    assert "engine_options" not in r.app_args    # every engine value null: the engine's defaults


def test_rdma_values_reach_every_worker_pod(render):
    r = render(RDMA)
    for g in r.cluster["workerGroupSpecs"]:
        spec = g["template"]["spec"]
        (c,) = spec["containers"]
        for side in ("limits", "requests"):       # extended resources: request == limit
            assert c["resources"][side]["rdma/rdma_shared_device_a"] == 1
            assert c["resources"][side]["nvidia.com/gpu"] == 1
            assert (c["resources"][side]["cpu"], c["resources"][side]["memory"]) == ("8", "48Gi")
        assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
        assert (spec["hostNetwork"], spec["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
        assert dshm(spec) == ({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                              {"name": "dshm", "mountPath": "/dev/shm"})
    # The head moves no KV blocks: only the object store's /dev/shm.
    head = r.head["template"]["spec"]
    (c,) = head["containers"]
    assert dshm(head)[1] == {"name": "dshm", "mountPath": "/dev/shm"}
    assert "securityContext" not in c and "hostNetwork" not in head
    assert "rdma/rdma_shared_device_a" not in c["resources"]["limits"]


def test_rdma_app_args_reach_the_node_actors_transfer_config(render):
    args = render(RDMA).app_args
    assert args["transfer_options"] == {"nixl_backend": "UCX", "nixl_devices": "0=mlx5_0,1=mlx5_1,*=mlx5_0"}
    assert args["engine_options"] == {"dtype": "bfloat16", "gpu_memory_utilization": 0.85,
                                      "kv_cache_memory_mb": 8192}
    spec = ServeConfig.from_args(dict(args)).cluster_spec()
    cfg = TransferConfig(**spec.transfer_options)    # what each prefill/decode actor builds
    assert NicMap.parse(cfg.nixl_devices).devices_for(1) == ("mlx5_1",)
    assert spec.engine_options["gpu_memory_utilization"] == 0.85


def test_efa_uses_libfabric_and_the_efa_device_plugin(render):
    r = render(EFA)
    for spec in worker_specs(r):
        (c,) = spec["containers"]
        for side in ("limits", "requests"):
            assert c["resources"][side]["vpc.amazonaws.com/efa"] == 4
        assert "hostNetwork" not in spec        # EFA needs no host network: the device plugin hands it in
    assert r.app_args["transfer_options"] == {"nixl_backend": "LIBFABRIC"}
    assert TransferConfig(**ServeConfig.from_args(dict(r.app_args)).transfer_options).nixl_backend == "LIBFABRIC"


def test_a_groups_own_resources_win_over_the_charts(render):
    decode = {"limits": {"rdma/hca": 2, "cpu": "4"}, "requests": {"rdma/hca": 2, "cpu": "4"}}
    r = render({"rdma": {"resources": {"rdma/hca": 1}}, "workerGroups": {"decode": {"resources": decode}}})
    (c,) = r.group("decode")["template"]["spec"]["containers"]
    for side in ("limits", "requests"):
        assert c["resources"][side] == {"rdma/hca": 2, "cpu": "4", "memory": "48Gi", "nvidia.com/gpu": 1}
    (c,) = r.group("prefill")["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["rdma/hca"] == 1 == c["resources"]["requests"]["rdma/hca"]


def test_every_data_plane_setting_validates_against_kuberays_crds(render):
    """Mixed groups with everything on, strict (an unknown pod field would fail)."""
    r = render({**MIXED, **RDMA})
    assert crd_schema.errors("RayService", r.rayservice) == []
    as_cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "x"}, "spec": r.cluster}
    assert crd_schema.errors("RayCluster", as_cluster) == []
    assert r.group("mixed")["template"]["spec"]["hostNetwork"] is True


@pytest.mark.parametrize("values", [RDMA, EFA], ids=["rdma", "efa"])
def test_chart_lints_clean_with_data_plane_values(values):
    result = helm_python.lint(str(CHART), values, strict=True, kube_version="v1.30.0")
    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] >= 2] == []


# --- engine values --------------------------------------------------------------------------------

def test_engine_values_become_engine_options_merged_with_the_others(render):
    args = render({"engine": {"dtype": "float16", "gpuMemoryUtilization": 1, "kvCacheMemoryMb": 512,
                              "quantization": "int8", "schedulePolicy": "srpt"},
                   "serve": {"admission": {"maxWaitingRequests": 8},
                             "extraArgs": {"engine_options": {"max_running_requests": 16, "dtype": "float32"}}}}
                  ).app_args
    # The chart's own values win over extraArgs on a clash; the rest of extraArgs passes through.
    assert args["engine_options"] == {"dtype": "float16", "gpu_memory_utilization": 1, "kv_cache_memory_mb": 512,
                                      "quantization": "int8", "schedule_policy": "srpt", "max_waiting_requests": 8,
                                      "max_running_requests": 16}
    options = ServeConfig.from_args(dict(args)).cluster_spec().engine_options
    assert (options["quantization"], options["kv_cache_memory_mb"]) == ("int8", 512)


def test_engine_enums_match_the_engine():
    from raypd.engine.config import EngineConfig
    from raypd.engine.model.quantization import QUANTIZATIONS

    engine = SCHEMA["properties"]["engine"]["properties"]
    dtypes = typing.get_args(typing.get_type_hints(EngineConfig)["dtype"])
    assert set(engine["dtype"]["enum"]) == {None, *dtypes}
    assert set(engine["quantization"]["enum"]) == {None, *QUANTIZATIONS}
    policies = typing.get_args(typing.get_type_hints(EngineConfig)["schedule_policy"])
    assert set(engine["schedulePolicy"]["enum"]) == {None, *policies}
    assert SCHEMA["properties"]["nixl"]["properties"]["backend"]["enum"] == list(NIXL_BACKENDS)


# --- values schema --------------------------------------------------------------------------------

@pytest.mark.parametrize("values,where", [
    ({"gpusPerNode": 2}, "/gpusPerNode': maximum: got 2, want 1"),
    ({"engine": {"dtype": "fp8"}}, "/engine/dtype"),
    ({"engine": {"gpuMemoryUtilization": 0}}, "/engine/gpuMemoryUtilization"),
    ({"engine": {"gpuMemoryUtilization": 1.2}}, "/engine/gpuMemoryUtilization"),
    ({"engine": {"kvCacheMemoryMb": 0}}, "/engine/kvCacheMemoryMb"),
    ({"engine": {"kvCacheMemoryMb": 1.5}}, "/engine/kvCacheMemoryMb"),
    ({"engine": {"quantization": "int4"}}, "/engine/quantization"),
    ({"engine": {"schedulePolicy": "sjf"}}, "/engine/schedulePolicy"),
    ({"engine": {"tp": 2}}, "tp"),
    ({"nixl": {"backend": "ucx"}}, "/nixl/backend"),
    ({"nixl": {"backend": "LIBFABRIC", "devices": "rdmap16s27"}}, "/nixl/devices': maxLength"),
    ({"nixl": {"devices": "0=mlx5_0;1=mlx5_1"}}, "/nixl/devices"),
    ({"rdma": {"resources": {"nvidia.com/gpu": 2}}}, "invalid propertyName 'nvidia.com/gpu'"),
    ({"rdma": {"resources": {"efa": 1}}}, "invalid propertyName 'efa'"),
    ({"rdma": {"resources": {"rdma/hca": 0}}}, "/rdma/resources/rdma~1hca"),
    ({"rdma": {"resources": {"rdma/hca": "1"}}}, "/rdma/resources/rdma~1hca"),
    ({"rdma": {"ipcLock": "yes"}}, "/rdma/ipcLock"),
    ({"shm": {"sizeLimit": "16 GB"}}, "/shm/sizeLimit"),
    ({"shm": {"size": "16Gi"}}, "size"),
    ({"hostNetwork": "true"}, "/hostNetwork"),
], ids=["gpus", "dtype", "util-zero", "util-high", "kv-zero", "kv-float", "quant", "policy", "engine-typo", "backend-case",
        "libfabric-devices", "devices-chars", "gpu-resource", "unqualified-resource", "resource-zero",
        "resource-string", "ipclock", "shm-quantity", "shm-typo", "hostnetwork"])
def test_values_schema_bounds_every_new_value(render, values, where):
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(where)):
        render(values)


def test_schema_says_why_one_gpu_per_node():
    gpus = SCHEMA["properties"]["gpusPerNode"]
    assert (gpus["minimum"], gpus["maximum"]) == (0, 1)
    assert "tensor parallelism" in gpus["description"]


def test_a_malformed_device_map_the_schema_lets_through_fails_in_the_app_builder(render):
    """The schema checks characters only; the app builder's TransferConfig parses the map."""
    from raypd.cluster.serve.config import ServeConfigError

    args = render({"nixl": {"devices": "0=mlx5_0,mlx5_1"}}).app_args
    with pytest.raises(ServeConfigError, match="mixes GPU=DEVICE entries"):
        ServeConfig.from_args(dict(args))
