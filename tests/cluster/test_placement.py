"""Role placement on a real local Ray node labelled as a decode machine: with place_by_role a decode
actor starts there and a prefill actor finds no node, while a flex node (which changes duty) takes any
machine meant for prefill, decode or flex; without it the prefill actor starts too, with its bootstrap
server on the node's IP."""
from __future__ import annotations

import dataclasses

import pytest
import ray

from raypd.cluster.launch.local_cluster import ROLE_LABEL, ClusterSpec, ClusterStartError, NodeCluster
from tests.cluster.helpers import FAST_TRANSFER

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes


@pytest.fixture(scope="module")
def spec(tiny_model_dir) -> ClusterSpec:
    """Nodes on the tiny model (tests/tiny_model.py): what is checked is where they start."""
    return ClusterSpec(model=tiny_model_dir, cpus_per_node=0.5, engine_options={"num_blocks": 64},
                       transfer_options=FAST_TRANSFER, place_by_role=True)


@pytest.fixture(scope="module")
def decode_machine():
    assert not ray.is_initialized()
    ray.init(address="local", num_cpus=2, labels={ROLE_LABEL: "decode"}, include_dashboard=False,  # never a `ray start` cluster
             log_to_driver=False)
    clusters: list[NodeCluster] = []
    try:
        yield clusters
    finally:
        for c in clusters:
            c.stop()
        ray.shutdown()


def test_actors_go_only_to_nodes_labelled_with_their_role(decode_machine, spec):
    by_role = NodeCluster(spec, started_ray=False)
    decode_machine.append(by_role)
    (decode,) = by_role.add_nodes(["decode"])
    assert decode.host.node_id == ray.get_runtime_context().get_node_id()
    # Never placeable, it waits out the start timeout whatever its length: a short one will do.
    strict = NodeCluster(dataclasses.replace(spec, start_timeout_s=3.0, name_prefix="strict"), started_ray=False)
    decode_machine.append(strict)
    with pytest.raises(ClusterStartError, match="raypd.io/role=prefill"):
        strict.add_nodes(["prefill"])  # no Ray node says raypd.io/role=prefill
    assert strict.nodes == []


def test_a_flex_node_goes_to_a_machine_labelled_for_either_duty(decode_machine, spec):
    flexible = NodeCluster(dataclasses.replace(spec, name_prefix="flex"), started_ray=False)
    decode_machine.append(flexible)
    (flex,) = flexible.add_nodes(["flex"], duties=["prefill"])
    assert flex.role == "flex" and flex.host.node_id == ray.get_runtime_context().get_node_id()
    assert ray.get(flex.actor.load_report.remote(), timeout=30).duty == "prefill"


def test_without_place_by_role_any_node_will_do(decode_machine, spec):
    anywhere = NodeCluster(dataclasses.replace(spec, place_by_role=False, name_prefix="anywhere"), started_ray=False)
    decode_machine.append(anywhere)
    (prefill,) = anywhere.add_nodes(["prefill"])
    assert prefill.role == "prefill"
    # Its bootstrap server listens on the Ray node's IP, which decode nodes on other machines can reach.
    assert prefill.bootstrap_address.startswith(f"tcp://{prefill.host.ip}:")
    assert prefill.host.ip == ray.util.get_node_ip_address()
