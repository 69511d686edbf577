"""--place-by-role's rules (cluster/launch/placement.py) on hand-built Ray node lists: the control
plane's selector names only head and ingress machines, a cluster without a live one is refused
with the label to set, and several ingress replicas are capped per host only where every one still
finds a host. Where the actors really run is tests/lab/test_pd_across_racks.py."""
from __future__ import annotations

import pytest

from raypd.cluster.launch.placement import (
    ROLE_LABEL,
    NoControlPlaneMachine,
    check_control_plane_machine,
    control_plane_hosts,
    control_plane_selector,
    ingress_replicas_per_host,
    placement_label,
)
from raypd.protocol.roles import Role


def node(role: str | None, alive: bool = True) -> dict:
    return {"Alive": alive, "Labels": {ROLE_LABEL: role} if role else {}}


def test_the_control_plane_goes_only_to_head_or_ingress_machines():
    assert control_plane_selector(True) == {ROLE_LABEL: "in(head,ingress)"}
    assert control_plane_selector(False) is None
    assert placement_label(Role.DECODE) == "decode" and placement_label(Role.FLEX) == "in(prefill,decode,flex)"


@pytest.mark.parametrize("nodes", [[node("head"), node("decode")], [node("ingress", True), node("head", False)]])
def test_a_live_head_or_ingress_machine_is_enough(nodes):
    check_control_plane_machine(nodes)


@pytest.mark.parametrize("nodes", [[node("prefill"), node("decode")], [node("head", alive=False), node("decode")],
                                   [node(None)]])
def test_without_one_the_launch_says_which_label_to_set(nodes):
    with pytest.raises(NoControlPlaneMachine, match="raypd.io/role=head or ingress.*ray start --head --labels"):
        check_control_plane_machine(nodes)


def test_ingress_replicas_are_spread_over_the_hosts_that_may_run_them():
    nodes = [node("head"), node("ingress"), node("ingress", alive=False), node("decode")]
    assert control_plane_hosts(nodes, place_by_role=True) == 2
    assert control_plane_hosts(nodes, place_by_role=False) == 3
    assert ingress_replicas_per_host(2, 2, place_by_role=True, ingress_cpus=0) == 1
    assert ingress_replicas_per_host(3, 2, place_by_role=True, ingress_cpus=1) == 2   # every replica still fits
    assert ingress_replicas_per_host(4, 3, place_by_role=False, ingress_cpus=0) == 2


@pytest.mark.parametrize("replicas,hosts,place_by_role,cpus", [
    (2, 1, True, 0),     # one head host: both replicas on it
    (1, 3, True, 0),     # one replica: nothing to spread
    (2, 0, False, 0),    # Ray not connected where the app is built
    (2, 3, False, 1),    # replicas that take CPUs on hosts that also run nodes: their room is not known
])
def test_no_cap_where_it_could_leave_a_replica_without_a_host(replicas, hosts, place_by_role, cpus):
    assert ingress_replicas_per_host(replicas, hosts, place_by_role, cpus) is None
