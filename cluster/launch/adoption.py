"""An application's actors across its node pool's restarts: where they live and what a starting pool
does with those it finds. Pure: it reads list_named_actors' entries; local_cluster.py acts on them.

    raypd/<app>/<deployment>     the Ray namespace of one deployment of Serve app <app> (one
                                 serve.run, one apply of a Serve config); <deployment> sorts in the
                                 order deployments were made (new_deployment_id())
      <prefix>-conductor         the Conductor
      <prefix>-<role>-<n>        the node actors: raypd-prefill-0, raypd-decode-1, ...

The actors are detached, so they outlive the pool replica that started them. A starting pool:
  - adopts every node actor alive in its own namespace (the same deployment: the same config);
  - starts, per role, as many nodes as the spec has more than it adopted (missing()), numbered
    after the highest it found (next_indices());
  - kills what older deployments of the same app left behind (stale): their pool died before it
    could stop them, and nothing else would.
Nothing of another app's namespace is ever touched.
"""
from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from raypd.protocol.duty import Duty
from raypd.protocol.roles import Role

NAMESPACE_ROOT = "raypd"
# The order a first start lists its nodes in (ClusterSpec.roles()), which an adopting pool keeps.
LAUNCH_ORDER = (Role.PREFILL, Role.DECODE, Role.FLEX, Role.MIXED)


def new_deployment_id() -> str:
    """A deployment's id: when it was made (milliseconds, fixed width, so ids sort in that order)
    and a random tail (two made in the same millisecond differ)."""
    return f"{time.time_ns() // 1_000_000:013d}-{secrets.token_hex(3)}"


def app_namespace(app_name: str, deployment: str) -> str:
    return f"{NAMESPACE_ROOT}/{app_name}/{deployment}"


def parse_namespace(namespace: str) -> tuple[str, str] | None:
    """(app name, deployment) of a namespace app_namespace() made; None for any other."""
    root, sep, rest = namespace.partition("/")
    app, sep2, deployment = rest.rpartition("/")
    if root != NAMESPACE_ROOT or not sep or not sep2 or not app or not deployment:
        return None
    return app, deployment


def node_name(prefix: str, role: Role, index: int) -> str:
    return f"{prefix}-{role}-{index}"


def conductor_name(prefix: str) -> str:
    return f"{prefix}-conductor"


def parse_node_name(prefix: str, name: str) -> tuple[Role, int] | None:
    """(role, index) of a name node_name() made with `prefix`; None for any other."""
    if not name.startswith(f"{prefix}-"):
        return None
    role, _, index = name[len(prefix) + 1:].rpartition("-")
    if role not in {r.value for r in Role} or not index.isdigit():
        return None
    return Role(role), int(index)


@dataclass(frozen=True)
class Found:
    """What a starting pool finds of its application on the Ray cluster."""
    nodes: tuple[str, ...]               # node actors alive in its own namespace, by name
    conductor: bool                      # its Conductor is alive there
    stale: tuple[tuple[str, str], ...]   # (namespace, name): actors older deployments of the app left


def find(listing: Iterable[dict], namespace: str, prefix: str) -> Found:
    """Sort list_named_actors(all_namespaces=True)'s entries into this deployment's own node actors
    (in the order a first start lists them) and Conductor (those in `namespace`), and what older
    deployments of the same app left. A newer deployment's actors are not stale: this pool is the
    one being replaced."""
    own = parse_namespace(namespace)
    nodes: list[tuple[int, int, str]] = []   # (role's place in LAUNCH_ORDER, index, name)
    stale: list[tuple[str, str]] = []
    conductor = False
    for entry in listing:
        name = entry["name"]
        if entry["namespace"] == namespace:
            if (parsed := parse_node_name(prefix, name)) is not None:
                nodes.append((LAUNCH_ORDER.index(parsed[0]), parsed[1], name))
            conductor = conductor or name == conductor_name(prefix)
        elif own is not None and (other := parse_namespace(entry["namespace"])) is not None \
                and other[0] == own[0] and other[1] < own[1]:
            stale.append((entry["namespace"], name))
    return Found(tuple(name for *_, name in sorted(nodes)), conductor, tuple(sorted(stale)))


def missing(roles: Sequence[Role], duties: Sequence[Duty | None],
            adopted: Iterable[Role]) -> list[tuple[Role, Duty | None]]:
    """The (role, first duty) of the spec's nodes that the adopted ones do not cover. Per role, the
    adopted nodes stand for the spec's first nodes of that role and the rest are started (a flex
    node with the duty the spec gives that position; the planner moves duties anyway)."""
    left: dict[Role, int] = {}
    for role in adopted:
        left[role] = left.get(role, 0) + 1
    out = []
    for role, duty in zip(roles, duties, strict=True):
        if left.get(role, 0) > 0:
            left[role] -= 1
        else:
            out.append((role, duty))
    return out


def next_indices(prefix: str, names: Iterable[str]) -> dict[Role, int]:
    """Per role, the index after the highest among `names`: where a pool that adopted them numbers
    its next node of that role, so no name is taken twice."""
    out: dict[Role, int] = {}
    for name in names:
        if (parsed := parse_node_name(prefix, name)) is not None:
            role, index = parsed
            out[role] = max(out.get(role, 0), index + 1)
    return out
