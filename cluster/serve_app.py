"""The raypd Serve application: a NodePool (owns the node actors) and the OpenAI ingress in front.

    raypd serve                                            (cluster/serve_cmd.py: starts Ray and Serve too)
    serve run cluster.serve_app:app_builder prefill_nodes=2 decode_nodes=2
    serveConfigV2: import_path: cluster.serve_app:app_builder, args: {model: /models/x, ...}

app_builder's args are ServeConfig's fields: model, prefill_nodes, decode_nodes, mixed_nodes,
policy, and the rest of ServeConfig for finer control; not the API key, which comes from
$RAYPD_API_KEY only (a Serve config file's args show in the Ray dashboard), as the data plane secret
comes from $RAYPD_DATA_PLANE_SECRET.
"""
from __future__ import annotations

import os
from dataclasses import fields, replace

from ray.serve import Application
from ray.serve.config import BackpressureConfig

from raypd.cluster.launch.gpu_budget import cluster_gpus
from raypd.cluster.launch.placement import control_plane_hosts, control_plane_selector, ingress_replicas_per_host
from raypd.cluster.openai.api_errors import RETRY_AFTER_S
from raypd.cluster.serve.config import ServeConfig, ServeConfigError
from raypd.cluster.serve.ingress import OpenAIIngress
from raypd.cluster.serve.node_pool import NodePool

# Room above a replica's AdmissionGate in Serve's own per-replica limit: the requests the gate is
# refusing right now, health probes, /admin and /v1/models.
SERVE_HEADROOM = 64
# How often a stopping replica of either deployment looks whether its requests are done. Serve's
# default, 2 s, is slept before the first look, so each stop (Ctrl-C, serve.delete, a scale-down)
# waited 2 s per deployment with nothing in flight. A request in flight is still waited for (up to
# the deployment's graceful_shutdown_timeout_s), and one that reaches a replica after its drain is
# refused there and retried on another replica by Serve's router.
STOP_POLL_S = 0.1


def build_serve_app(config: ServeConfig) -> Application:
    # @serve.deployment turns the classes into Deployments; type checkers still see the classes.
    # With place_by_role the control plane stays off the node machines (cluster/launch/placement.py).
    where = {"label_selector": selector} if (selector := control_plane_selector(config.place_by_role)) else {}
    pool = NodePool.options(ray_actor_options={"num_cpus": 0, **where},  # type: ignore[attr-defined]
                            graceful_shutdown_wait_loop_s=STOP_POLL_S).bind(config)
    # Serve's limits sit above the gate's (which answers 429 with an OpenAI body), so Serve's own
    # back-pressure only ever meets a flood the gate cannot answer fast enough; then it answers 429
    # with Retry-After too, never its default 503.
    ongoing, queued = config.admission_limits(cluster_gpus())
    serve_limit = ongoing + queued + SERVE_HEADROOM
    # Several replicas on several hosts: spread, so one host's loss takes the fewest (placement.py).
    hosts = control_plane_hosts(_ray_nodes(), config.place_by_role)
    per_host = ingress_replicas_per_host(config.ingress_replicas, hosts, config.place_by_role, config.ingress_cpus)
    spread = {"max_replicas_per_node": per_host} if per_host is not None else {}
    ingress = OpenAIIngress.options(  # type: ignore[attr-defined]
        num_replicas=config.ingress_replicas, ray_actor_options={"num_cpus": config.ingress_cpus, **where},
        max_ongoing_requests=serve_limit, max_queued_requests=serve_limit, graceful_shutdown_wait_loop_s=STOP_POLL_S,
        backpressure_config=BackpressureConfig(status_code=429, retry_after_s=RETRY_AFTER_S), **spread)
    return ingress.bind(config, pool)


def _ray_nodes() -> list[dict]:
    """The Ray cluster's nodes, where the app is built (none when Ray is not connected here)."""
    import ray
    return ray.nodes() if ray.is_initialized() else []


def app_builder(args: dict) -> Application:
    """Serve's application-builder entry point (`serve run` passes key=value args as strings)."""
    args = {k: _coerce(k, v) for k, v in dict(args).items()}
    if "api_key" in args:
        raise ServeConfigError("the API key is read from RAYPD_API_KEY, not from the app args "
                               "(a Serve config file's args show in the Ray dashboard)")
    config = ServeConfig.from_args(args)
    key = os.environ.get("RAYPD_API_KEY") or None
    return build_serve_app(replace(config, api_key=key) if key else config)


_TYPES = {f.name: str(f.type) for f in fields(ServeConfig)}


def _coerce(name: str, value):
    """'2' -> 2 for the int and float fields; values from a YAML config already have their type."""
    if not isinstance(value, str):
        return value
    kind = _TYPES.get(name, "")
    try:
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
    except ValueError:
        raise ServeConfigError(f"app arg {name}={value!r} is not a number") from None
    return value
