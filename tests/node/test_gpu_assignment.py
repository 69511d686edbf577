"""node/gpu_assignment.py: a node actor's device from the GPU ids Ray assigned it (the ids and the
environment given here; tests/cluster/test_gpu_placement.py does it through a real Ray actor)."""
from __future__ import annotations

import pytest

from raypd.cluster.launch.gpu_budget import GpuBudgetError, check_gpus_per_node, gpus_per_node
from raypd.node.gpu_assignment import GpuAssignment, GpuAssignmentError, node_device


def given(ids=(), visible=None, cuda=True) -> GpuAssignment:
    return GpuAssignment(tuple(ids), visible, cuda)


def test_the_assigned_gpu_is_the_device_at_its_place_in_cuda_visible_devices():
    assert given(["3"], visible="3").device("auto") == "cuda:0"      # Ray narrowed the view to it
    assert given(["3"], visible="1,3").device("auto") == "cuda:1"
    assert given(["2"], visible=None).device("cuda") == "cuda:2"     # override off: the id is the index
    assert given(["2"], visible=None).device("cuda:0") == "cuda:2"   # never another GPU than Ray's


def test_cuda_visible_without_an_assigned_gpu_is_an_error_not_gpu_0():
    with pytest.raises(GpuAssignmentError, match="assigned it no GPU.*--gpus-per-node 1"):
        given([], cuda=True).device("auto")
    with pytest.raises(GpuAssignmentError, match="assigned it no GPU"):
        given([], cuda=False).device("cuda")


def test_no_cuda_and_no_gpu_runs_on_the_cpu():
    assert given([], cuda=False).device("auto") == "cpu"
    assert given([], cuda=True).device("cpu") == "cpu"


def test_cpu_requested_with_a_gpu_assigned_stays_on_the_cpu(caplog):
    assert given(["0"], visible="0").device("cpu") == "cpu"
    assert "keeps it on the CPU" in caplog.text


def test_more_than_one_gpu_per_node_is_refused():
    with pytest.raises(GpuAssignmentError, match="no tensor parallelism"):
        given(["0", "1"], visible="0,1").device("auto")


def test_an_assigned_gpu_hidden_by_cuda_visible_devices_is_an_error():
    with pytest.raises(GpuAssignmentError, match="hides it"):
        given(["4"], visible="0,1").device("auto")
    with pytest.raises(GpuAssignmentError, match="not an index"):
        given(["GPU-8f2c"], visible=None).device("auto")


def test_outside_a_ray_actor_the_request_is_unchanged(caplog):
    assert node_device("auto", None, "n") == "auto"
    assert GpuAssignment.of_this_actor() is None  # no Ray here
    caplog.set_level("INFO")
    assert node_device("auto", given(["1"], visible="1"), "decode-0") == "cuda:0"
    assert "decode-0: Ray assigned GPU ids ['1']" in caplog.text


def test_gpus_per_node_defaults_to_one_where_ray_has_gpus_and_refuses_more_than_one():
    assert gpus_per_node(None, cluster_gpus=8) == 1.0
    assert gpus_per_node(None, cluster_gpus=0) == 0.0
    assert gpus_per_node(0.5, cluster_gpus=8) == 0.5   # several small engines share a GPU
    assert gpus_per_node(0, cluster_gpus=8) == 0       # CPU nodes on a GPU cluster, asked for
    for bad in (2, 1.5, -1):
        with pytest.raises(GpuBudgetError, match="gpus-per-node"):
            check_gpus_per_node(bad)
