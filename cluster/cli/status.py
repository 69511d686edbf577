"""`raypd status`: the nodes of a running raypd cluster, one row each, from its Conductor.

    connect (--address, default auto) -> the named Conductor's status()   -> table | --json
                                      -> none: each node actor raypd-<role>-<i>: ready(), load_report(), stats()

Without a Conductor the nodes answer themselves; they know no hit rate (that needs the Conductor's
per-request accounting), and a prefill node's prefix copies stand in for migrations.
"""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from raypd.protocol.roles import Role

NODE_ACTOR = re.compile(rf"^raypd-({'|'.join(r.value for r in Role)})-\d+$")  # local_cluster's actor names
CALL_TIMEOUT_S = 10.0
COLUMNS = [  # header, cell of a node that answered
    ("NODE", lambda r: r["name"]), ("ROLE", lambda r: r["role"]), ("HOST", lambda r: r["host"] or "-"),
    ("STATE", lambda r: "up" if r["alive"] else "dead"),
    ("QUEUED", lambda r: str(r["queued_prefill_tokens"])), ("RUNNING", lambda r: str(r["running"])),
    ("WAITING", lambda r: str(r["waiting"])), ("FREE KV", lambda r: f"{r['free_blocks']}/{r['total_blocks']}"),
    ("CACHED", lambda r: str(r["cached_blocks"])),
    ("HIT RATE", lambda r: "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}"),
    ("MIGR IN/OUT", lambda r: "-" if r["migrations_in"] is None else f"{r['migrations_in']}/{r['migrations_out']}"),
]


class StatusError(RuntimeError):
    """raypd status cannot answer; the message is the one line the user sees."""


def add_status_parser(sub) -> None:
    p = sub.add_parser("status", help="the nodes of a running raypd cluster: load, KV blocks, cache hit rate")
    p.add_argument("--address", default="auto", help="Ray cluster address (default: auto, the local cluster)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run_status)


def run_status(args) -> int:
    try:
        status = collect(args.address)
    except StatusError as e:
        print(f"raypd status: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(status, indent=2, default=str) if args.json else format_status(status))
    return 0


# -- gathering ----------------------------------------------------------------------------------------
def collect(address: str) -> dict:
    import ray

    from raypd.conductor.actor import DEFAULT_NAME

    connect(address)
    try:
        named = ray.util.list_named_actors(all_namespaces=True)
        note = "no Conductor running"
        conductor = next((a for a in named if a["name"] == DEFAULT_NAME), None)
        if conductor is not None:
            try:
                handle = ray.get_actor(conductor["name"], namespace=conductor["namespace"])
                st: Any = ray.get(handle.status.remote(), timeout=CALL_TIMEOUT_S)  # Ray's stubs say list
                return from_conductor(st)
            except Exception as e:  # noqa: BLE001 - the nodes can still answer for themselves
                note = f"the Conductor did not answer ({type(e).__name__}: {_first_line(e)})"
        nodes = sorted((a for a in named if NODE_ACTOR.match(a["name"])), key=lambda a: a["name"])
        if not nodes:
            raise StatusError(f"{note} and no raypd node actors on this Ray cluster (is `raypd serve` running?)")
        return from_nodes([_ask_node(ray, a["name"], a["namespace"]) for a in nodes], note)
    finally:
        ray.shutdown()


def connect(address: str) -> None:
    """ray.init(address), failing in seconds with one line: a dead address would make ray.init wait
    for minutes, so its GCS port is probed first."""
    import ray
    from ray._private.services import canonicalize_bootstrap_address  # what ray.init resolves "auto" with

    try:
        resolved = canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError) as e:
        raise StatusError(f"no running Ray cluster found ({address}): start one with `raypd serve`") from e
    if resolved is None:
        raise StatusError("no running Ray cluster found: start one with `raypd serve`")
    host, _, port = resolved.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=3.0).close()
    except (OSError, ValueError):
        raise StatusError(f"no Ray cluster answers at {resolved}") from None
    _use_local_token(host.strip("[]"))
    try:
        ray.init(address=resolved, log_to_driver=False, logging_level=logging.ERROR)  # no chatter on stdout
    except (ConnectionError, RuntimeError) as e:
        # Ray sends its token only when asked to (RAY_AUTH_MODE=token) to an address given explicitly.
        if "auth" in f"{e} {e.__cause__}".lower():
            raise StatusError(f"the Ray cluster at {resolved} requires its auth token: set RAY_AUTH_MODE=token "
                              "(the token comes from ~/.ray/auth_token or $RAY_AUTH_TOKEN)") from None
        raise StatusError(f"cannot connect to the Ray cluster at {resolved}: {_first_line(e)}") from None


def _use_local_token(host: str) -> None:
    """Send this machine's Ray token to a cluster on this machine, as ray.init does for "auto": a
    local `raypd serve` enables token auth, and Ray sends no token to an explicit address unless
    RAY_AUTH_MODE=token (it would retry for 20 s, then fail). Never for a remote address."""
    import ray.util

    if "RAY_AUTH_MODE" in os.environ or not (host.startswith("127.") or host == ray.util.get_node_ip_address()):
        return
    if os.environ.get("RAY_AUTH_TOKEN") or Path(os.environ.get("RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token")).expanduser().exists():
        from ray._raylet import Config  # type: ignore[attr-defined]  # not in Ray's stubs

        os.environ["RAY_AUTH_MODE"] = "token"
        Config.initialize("")  # Ray caches its config: re-read it, as ray.init's own "auto" path does


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _ask_node(ray, name: str, namespace: str) -> dict:
    try:
        actor = ray.get_actor(name, namespace=namespace)
        info, load, stats = ray.get([actor.ready.remote(), actor.load_report.remote(), actor.stats.remote()],
                                    timeout=CALL_TIMEOUT_S)
        return {"name": name, "info": info, "load": asdict(load), "stats": stats}
    except Exception as e:  # noqa: BLE001 - a dead or stuck node is a row with its error
        return {"name": name, "error": f"{type(e).__name__}: {_first_line(e)}"}


# -- normalizing (pure) -------------------------------------------------------------------------------
def from_conductor(st: dict) -> dict:
    """Rows from Conductor.status()."""
    rows = []
    for name, n in sorted(st.get("nodes", {}).items()):
        rate = n.get("delivered_hit_rate")
        rows.append({"name": name, "role": n["role"], "host": n.get("host", ""), "alive": n.get("alive", True),
                     "queued_prefill_tokens": n.get("queued_prefill_tokens", 0), "running": n.get("running", 0),
                     "waiting": n.get("waiting", 0), "free_blocks": n.get("free_blocks", 0),
                     "total_blocks": n.get("total_blocks", 0), "cached_blocks": n.get("cached_blocks", 0),
                     "hit_rate": rate, "migrations_in": n.get("migrations_in", 0),
                     "migrations_out": n.get("migrations_out", 0), "error": n.get("death_reason")})
    summary = {k: st.get(k) for k in ("policy", "decisions", "rejected", "migrations")}
    return {"source": "conductor", **summary, "nodes": rows}


def from_nodes(answers: list[dict], note: str = "no Conductor running") -> dict:
    """Rows from the node actors' own ready() / load_report() / stats() (no Conductor)."""
    rows = []
    for a in answers:
        if "error" in a:
            rows.append({"name": a["name"], "role": _role_of(a["name"]), "host": "", "alive": False,
                         "error": a["error"]})
            continue
        load, stats, host = a["load"], a["stats"], a["info"].get("host")
        copies = stats.get("prefix_copies") or {}
        rows.append({"name": a["name"], "role": load["role"], "host": _hostname(host), "alive": True,
                     **{k: load[k] for k in ("queued_prefill_tokens", "running", "waiting", "free_blocks",
                                             "total_blocks", "cached_blocks")},
                     "hit_rate": None, "migrations_in": copies.get("imported"),
                     "migrations_out": copies.get("exported"), "error": None})
    return {"source": "nodes", "note": note, "nodes": rows}


def _role_of(name: str) -> str:
    m = NODE_ACTOR.match(name)
    return m.group(1) if m else "?"


def _hostname(host: Any) -> str:
    """HostInfo, or its dict form once it crossed as JSON."""
    if isinstance(host, dict):
        return host.get("hostname") or host.get("ip", "")
    return getattr(host, "hostname", "") or getattr(host, "ip", "") or ""


# -- formatting (pure) --------------------------------------------------------------------------------
def format_status(status: dict) -> str:
    lines = []
    if status["source"] == "conductor":
        mig = status.get("migrations") or {}
        lines.append(f"Conductor: policy {status.get('policy')}, {status.get('decisions', 0)} decisions, "
                     f"{status.get('rejected', 0)} rejected, migrations {mig.get('finished', 0)} finished / "
                     f"{mig.get('failed', 0)} failed / {mig.get('active', 0)} active")
    else:
        lines.append(f"{status.get('note', 'no Conductor running')}: per-node reports "
                     "(no hit rate; migrations are prefix copies)")
    table = [[header for header, _ in COLUMNS]] + [_cells(row) for row in status["nodes"]]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines += [f"{row['name']}: {row['error']}" for row in status["nodes"] if row.get("error")]
    return "\n".join(lines)


def _cells(row: dict) -> list[str]:
    if "running" not in row:  # the node did not answer: who it is, and nothing else
        return [row["name"], row["role"], row["host"] or "-", "no answer"] + ["-"] * (len(COLUMNS) - 4)
    return [cell(row) for _, cell in COLUMNS]
