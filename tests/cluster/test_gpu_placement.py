"""GPU placement through real Ray actors on a Ray node that reports one (logical) GPU. This machine
has no CUDA, so what can be checked is the decision: the default asks Ray for one GPU per node, the
actor gets Ray's GPU id, and its engine then refuses to run without CUDA instead of quietly using
the CPU (or GPU 0); on a machine with CUDA the same node starts on that GPU; `--device cpu` keeps
such a node on the CPU. tests/node/test_gpu_assignment.py
covers the id -> device mapping."""
from __future__ import annotations

import dataclasses
import time

import pytest
import ray

from raypd.cluster.launch.local_cluster import ClusterSpec, ClusterStartError, NodeCluster

pytestmark = pytest.mark.cluster  # starts Ray

# The nodes run the tiny model (tests/tiny_model.py): what is checked is where they run, not the tokens.
SPEC = ClusterSpec(mixed_nodes=1, cpus_per_node=0.5, engine_options={"num_blocks": 64}, start_timeout_s=120.0)


@pytest.fixture(scope="module")
def one_gpu_ray():
    assert not ray.is_initialized()
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)  # never a `ray start` cluster
    try:
        yield
    finally:
        ray.shutdown()


def test_default_asks_for_one_gpu_and_the_engine_wants_the_cuda_device_ray_gave(one_gpu_ray, tiny_model_dir):
    import torch

    spec = dataclasses.replace(SPEC, name_prefix="gpu-default", model=tiny_model_dir)
    if torch.cuda.is_available():  # a GPU machine: the node runs on the GPU Ray gave it, and holds it
        cluster = NodeCluster.start(spec)
        try:
            assert cluster.spec.gpus_per_node == 1.0 and ray.available_resources().get("GPU", 0) == 0
        finally:
            cluster.stop()
    else:  # no CUDA here: the engine refuses instead of quietly running on the CPU
        with pytest.raises(ClusterStartError, match="cuda:0.*CUDA is not available"):
            NodeCluster.start(spec)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("GPU") != 1:  # the failed actor gives its GPU back
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)


def test_device_cpu_keeps_a_gpu_node_on_the_cpu(one_gpu_ray, tiny_model_dir):
    cluster = NodeCluster.start(dataclasses.replace(SPEC, name_prefix="gpu-cpu", model=tiny_model_dir,
                                                    engine_options={"num_blocks": 64, "device": "cpu"}))
    try:
        (node,) = cluster.nodes
        assert ray.available_resources().get("GPU", 0) == 0  # it holds the GPU Ray assigned it
        assert cluster.spec.gpus_per_node == 1.0
        assert ray.get(node.actor.stats.remote(), timeout=60)["num_blocks"] == 64
    finally:
        cluster.stop()
