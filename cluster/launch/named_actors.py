"""Ray calls on an application's named, detached actors (cluster/launch/adoption.py says which and
why): kill one or a whole namespace, and read how often Ray restarted one."""
from __future__ import annotations

import logging

import ray

log = logging.getLogger(__name__)


def kill_namespace(namespace: str) -> list[str]:
    """Kill every named actor alive in `namespace` (an app deployment's: its detached actors never
    die by themselves); returns their names."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == namespace]
    for name in names:
        kill_named(name, namespace)
    return names


def restarts_of(actor) -> int:
    """How many times Ray has restarted `actor`, from the GCS's actor table: an adopted actor's
    incarnation as the node pool's supervisor counts them (one per restart). Ray has no public
    call for it (the state API needs the dashboard); 0 when the table cannot be read."""
    try:
        from ray._private.state import actors  # the GCS client behind `ray list actors`

        return int(actors(actor._actor_id.hex()).get("NumRestarts", 0))
    except Exception as e:  # noqa: BLE001 - an incarnation is for operators and routers: 0 will do
        log.warning("could not read an actor's restart count: %s", e)
        return 0


def kill_named(name: str, namespace: str) -> None:
    try:
        ray.kill(ray.get_actor(name, namespace=namespace))
    except ValueError:   # gone already
        pass
