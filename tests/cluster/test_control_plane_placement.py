"""--place-by-role's rules (cluster/launch/placement.py) on hand-built Ray node lists: the control
plane's selector names only head and ingress machines, and a cluster without a live one is refused
with the label to set. Where the actors really run is tests/lab/test_serve_across_hosts.py."""
from __future__ import annotations

import pytest

from raypd.cluster.launch.placement import (
    ROLE_LABEL,
    NoControlPlaneMachine,
    check_control_plane_machine,
    control_plane_selector,
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
