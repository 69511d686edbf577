"""Where raypd's actors may run when the cluster's machines say what they are for (`--place-by-role`):
each Ray node carries the label raypd.io/role (cluster/cluster.yaml, the Helm chart, `ray start
--labels`), and every actor gets a label selector.

    node actors          the machines of their role (a flex node: any prefill, decode or flex one)
    control plane        the ingress replicas, the node pool and the Conductor: only machines
                         labelled head or ingress, never a node machine, so that losing or cutting
                         off a node's machine takes that node and nothing else (a lab run put the
                         only ingress replica on a decode host, and a partition of that host failed
                         every stream)

Without --place-by-role nothing is constrained (one machine, or a cluster without labels).

Several ingress replicas spread over the hosts that may run them (those labelled for the control
plane, or with no --place-by-role any): at most ceil(replicas / hosts) on one, Serve's
max_replicas_per_node, so losing one host takes the fewest replicas. The hosts are counted when the
app is built, so the cap always fits the cluster it deploys on (one head and 2 replicas: no cap,
both on the head); a host lost later leaves its replicas waiting for a host with room while the
others serve. With ingress CPUs and no --place-by-role, the hosts' free CPUs are not known to fit:
no cap (Serve still spreads replicas by default, without a promise).
"""
from __future__ import annotations

import math

from raypd.protocol.roles import Role

# The Ray node label that says which raypd role a machine is for.
ROLE_LABEL = "raypd.io/role"
CONTROL_PLANE_ROLES = ("head", "ingress")


class NoControlPlaneMachine(RuntimeError):
    """--place-by-role, and no live Ray node is labelled for the control plane."""


def placement_label(role: Role) -> str:
    """The raypd.io/role values a node of this role may run on (a Ray label selector value). A flex
    node changes duty at run time, so any machine meant for prefill or decode will do, or one
    labelled flex: a chart or cluster.yaml written for PD serves --adaptive unchanged."""
    return "in(prefill,decode,flex)" if role is Role.FLEX else role.value


def control_plane_selector(place_by_role: bool) -> dict[str, str] | None:
    """The label selector of the ingress, the node pool and the Conductor; None: anywhere."""
    return {ROLE_LABEL: f"in({','.join(CONTROL_PLANE_ROLES)})"} if place_by_role else None


def check_control_plane_machine(nodes: list[dict]) -> None:
    """Raise unless one of `nodes` (ray.nodes()) is alive and labelled for the control plane: its
    actors would otherwise wait forever for a machine."""
    if not any(n.get("Alive") and n.get("Labels", {}).get(ROLE_LABEL) in CONTROL_PLANE_ROLES for n in nodes):
        roles = sorted({str(n.get("Labels", {}).get(ROLE_LABEL)) for n in nodes if n.get("Alive")})
        raise NoControlPlaneMachine(
            f"--place-by-role puts the ingress, the node pool and the Conductor on Ray nodes labelled "
            f"{ROLE_LABEL}={' or '.join(CONTROL_PLANE_ROLES)}, and no live node is (their labels: {', '.join(roles)}); "
            f"label the head: ray start --head --labels {ROLE_LABEL}=head")


def control_plane_hosts(nodes: list[dict], place_by_role: bool) -> int:
    """The live Ray nodes (ray.nodes()) an ingress replica may run on."""
    return sum(1 for n in nodes if n.get("Alive") and
               (not place_by_role or n.get("Labels", {}).get(ROLE_LABEL) in CONTROL_PLANE_ROLES))


def ingress_replicas_per_host(replicas: int, hosts: int, place_by_role: bool, ingress_cpus: float) -> int | None:
    """Serve's max_replicas_per_node for the ingress (module docstring); None: no cap."""
    if replicas <= 1 or hosts <= 1 or (ingress_cpus > 0 and not place_by_role):
        return None
    return math.ceil(replicas / hosts)
