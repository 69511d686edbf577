"""init_ray: join a Ray cluster, or start a local one with enough logical CPUs for raypd's actors;
stop_ray, its counterpart; and reason(), the one line of a Ray error that start-up failures report.

The launcher (`raypd generate --mode pd|mixed`, the benchmarks, the Serve NodePool) and `raypd serve`
both come here. A Ray started here reserves enough logical CPUs for every actor even on a 2-core
machine: the actors then share cores, which the benchmark notes say.

Joining is explicit: `--address`, or RAY_ADDRESS in the environment. Without either, Ray itself
would join the cluster `ray start` last recorded on this machine (the `ray_current_cluster` file in
its temp folder, left behind when that cluster died without `ray stop`) and fail there with "num_cpus
and num_gpus must not be provided"; raypd starts its own instead (address="local").
"""
from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

RAY_ADDRESS_VARIABLE = "RAY_ADDRESS"  # Ray's own: the cluster to join when no --address is given


class RayInit(NamedTuple):
    context: Any    # what ray.init returned (dashboard_url, address_info); None if Ray was already up
    started: bool   # Ray was started here: stopping it is ours to do


def local_num_cpus(cpus_needed: float) -> int:
    """Logical CPUs for a Ray started here: enough for `cpus_needed`, at least the machine's cores."""
    return max(math.ceil(cpus_needed), os.cpu_count() or 1)


def reason(e: object) -> str:
    """The line of an error a user should see: its last non-empty one (Ray ends the traceback it
    wraps an actor's or a deployment's exception in with that exception)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__


def init_ray(address: str | None, cpus_needed: float, *, num_cpus: int | None = None,
             local_options: dict[str, Any] | None = None, **options: Any) -> RayInit:
    """Nothing when this process is already connected to Ray; else join `address`, or start Ray here
    with `num_cpus` logical CPUs (default: local_num_cpus(cpus_needed)). `options` go to ray.init
    either way, `local_options` (dashboard, metrics port) only when Ray starts here."""
    import ray  # here, not at the top: the command line loads Ray only once a command needs it

    if ray.is_initialized():
        return RayInit(None, False)
    address = address or os.environ.get(RAY_ADDRESS_VARIABLE) or None
    if address:
        return RayInit(ray.init(address=address, **options), False)
    cpus = num_cpus or local_num_cpus(cpus_needed)
    return RayInit(ray.init(address="local", num_cpus=cpus, **(local_options or {}), **options), True)


def stop_ray(started: bool) -> None:
    """ray.shutdown(): disconnect, and stop the local Ray if `started` (init_ray started it here).
    Ray stops a local head's daemons one after the other, each given a second to exit on SIGTERM.
    Its autoscaler monitor answers SIGTERM by reporting "the autoscaler failed" to the GCS and the
    drivers, which takes it about that second (or all of it, then Ray kills it): stopping a local Ray
    took ~1.5 s, ~0.1 s without it. So it is killed here first, as Ray's own SIGKILL would."""
    import ray

    if started:
        _kill_autoscaler_monitor()
    ray.shutdown()


def _kill_autoscaler_monitor() -> None:
    try:   # Ray's own record of the daemons it started here (no public API has it)
        from ray._private import ray_constants, worker

        node = worker._global_node
        monitors: list = node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []) if node is not None else []
        for info in monitors:
            info.process.kill()
            info.process.wait(timeout=1)
    except Exception:  # noqa: BLE001 - Ray changed: ray.shutdown stops it as before, a second later
        pass
