"""The raypd Serve application: a NodePool (owns the node actors) and the OpenAI ingress in front.

    raypd serve                                            (cluster/serve_cmd.py: starts Ray and Serve too)
    serve run cluster.serve_app:app_builder prefill_nodes=2 decode_nodes=2
    serveConfigV2: import_path: cluster.serve_app:app_builder, args: {model: /models/x, ...}

app_builder's args are ServeConfig's fields: model, prefill_nodes, decode_nodes, mixed_nodes,
policy, api_key (default: $RAYPD_API_KEY), and the rest of ServeConfig for finer control.
"""
from __future__ import annotations

import os
from dataclasses import fields

from ray.serve import Application

from raypd.cluster.serve.config import ServeConfig, ServeConfigError
from raypd.cluster.serve.ingress import OpenAIIngress
from raypd.cluster.serve.node_pool import NodePool


def build_serve_app(config: ServeConfig) -> Application:
    # @serve.deployment turns the classes into Deployments; type checkers still see the classes.
    pool = NodePool.bind(config)  # type: ignore[attr-defined]
    ingress = OpenAIIngress.options(num_replicas=config.ingress_replicas,  # type: ignore[attr-defined]
                                    ray_actor_options={"num_cpus": config.ingress_cpus})
    return ingress.bind(config, pool)


def app_builder(args: dict) -> Application:
    """Serve's application-builder entry point (`serve run` passes key=value args as strings)."""
    args = {k: _coerce(k, v) for k, v in dict(args).items()}
    args.setdefault("api_key", os.environ.get("RAYPD_API_KEY") or None)
    return build_serve_app(ServeConfig.from_args(args))


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
