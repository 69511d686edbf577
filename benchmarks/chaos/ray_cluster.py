"""The Ray cluster the started `raypd serve` runs on, and only that one: its address (from the
server's log; also `raypd bench soak`'s), a driver connection, raypd's actors in it, the check that a pid is one of its
worker processes, and the processes of it still alive after the server stopped.

Ray is imported only when connecting; psutil is imported here (it comes with raypd's test extra).
"""
from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import psutil

from raypd.benchmarks.serve.systems import Launched, LaunchError

# Ray actor class -> the role a kill target has (schedule.py's ROLES).
CLASS_ROLES = {"PrefillNode": "prefill", "DecodeNode": "decode", "MixedNode": "mixed", "FlexNode": "flex",
               "Conductor": "conductor"}
Route = tuple[str, str, float]   # a decision: prefill node, decode node, when (the Conductor's time.time())
_ADDRESS_LINE = re.compile(r"Ray cluster: (\S+)")


class KillRefused(RuntimeError):
    """The pid is not a worker process of the server's Ray cluster: nothing was signalled."""


@dataclass(frozen=True, slots=True)
class Target:
    """One raypd actor found alive in the cluster."""
    name: str
    role: str
    namespace: str
    pid: int
    class_name: str
    node_id: str = ""   # the Ray node it runs on


def ray_address_from_log(text: str) -> str | None:
    """The GCS address `raypd serve` logs once its application is up ("Ray cluster: HOST:PORT")."""
    found = _ADDRESS_LINE.findall(text)
    return found[-1] if found else None


def wait_for_ray_address(launched: Launched, timeout_s: float) -> str:
    """The started server's GCS address, once its log names it; LaunchError if it exits or never does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        address = ray_address_from_log(launched.log_tail(200_000))
        if address:
            return address
        if launched.proc.poll() is not None:
            break
        time.sleep(0.5)
    raise LaunchError(f"raypd serve did not log its Ray cluster address (\"Ray cluster: ...\"):\n{launched.log_tail()}")


def targets_from_actor_states(states: list) -> list[Target]:
    """raypd's actors among list_actors' entries (objects or dicts, as Ray versions differ)."""
    out = []
    for a in states:
        get = a.get if isinstance(a, dict) else lambda k, a=a: getattr(a, k, None)
        cls, name = get("class_name"), get("name")
        if cls in CLASS_ROLES and name and get("state") in (None, "ALIVE"):
            out.append(Target(name, CLASS_ROLES[cls], get("ray_namespace") or "", int(get("pid") or 0), cls,
                              str(get("node_id") or "")))
    return sorted(out, key=lambda t: t.name)


def targets_from_actor_table(table: dict, namespaces: dict[str, str]) -> list[Target]:
    """raypd's ALIVE actors in Ray's GCS actor table (ray._private.state.actors(): no dashboard needed);
    `namespaces`: actor name -> its namespace (list_named_actors)."""
    out = []
    for a in table.values():
        cls, name = a.get("ActorClassName"), a.get("Name")
        if cls in CLASS_ROLES and name and a.get("State") == "ALIVE":
            out.append(Target(name, CLASS_ROLES[cls], namespaces.get(name, ""), int(a.get("Pid") or 0), cls,
                              str((a.get("Address") or {}).get("NodeID") or "")))
    return sorted(out, key=lambda t: t.name)


class RayCluster:
    """A driver connected to the server's Ray cluster (close() disconnects it before the server stops:
    a driver whose cluster disappears under it waits for it and then exits the process)."""

    def __init__(self, address: str, server_pid: int, lab_netns: frozenset[str] = frozenset()):
        self.address = address
        self.server_pid = server_pid
        # On the lab the server joins a Ray cluster it did not start: its workers are not under it,
        # and a pid is the cluster's when it runs in one of the lab's network namespaces ("net:[INODE]").
        self.lab_netns = lab_netns
        self.server_started = psutil.Process(server_pid).create_time()
        self._ray: Any = None  # the ray module once connected
        self.session_dir: str | None = None  # e.g. /tmp/ray/session_...: every Ray daemon of it names it

    def connect(self) -> None:
        # A Ray that `ray.init()` starts turns token authentication on unless RAY_AUTH_MODE says otherwise,
        # and a driver joining by address uses the token (~/.ray/auth_token) only when RAY_AUTH_MODE=token.
        # The server inherited this environment, so the same default holds for both.
        # Set for this connection only (close() restores it): a process that later starts a Ray of its
        # own must not inherit the change. Ray reads it when it first initializes its config in this
        # process, so `raypd bench chaos` connects from a process of its own (the test runs it so too).
        self._auth_mode = os.environ.get("RAY_AUTH_MODE")
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        import ray

        ctx = ray.init(address=self.address, namespace="raypd-bench-chaos", log_to_driver=False,
                       logging_level=logging.WARNING)
        self._ray = ray
        self.session_dir = (getattr(ctx, "address_info", None) or {}).get("session_dir")

    def close(self) -> None:
        if self._ray is not None and self._ray.is_initialized():
            self._ray.shutdown()
        self._ray = None
        if getattr(self, "_auth_mode", "unset") is None:
            os.environ.pop("RAY_AUTH_MODE", None)

    @property
    def ray(self):
        if self._ray is None:
            raise RuntimeError("not connected")
        return self._ray

    def targets(self) -> list[Target]:
        """raypd's ALIVE actors, with their current pids (a restart changes the pid). On the lab, whose
        Ray runs without a dashboard (the state API's server), from the GCS's actor table."""
        from ray.util.state import list_actors

        self.ray  # noqa: B018 - connected first: the state API is asked through this cluster's GCS
        if self.lab_netns:
            from ray._private.state import actors
            from ray.util import list_named_actors

            named = {a["name"]: a["namespace"] for a in list_named_actors(all_namespaces=True)}
            return targets_from_actor_table(actors(actor_state_name="ALIVE"), named)
        states = list_actors(address=self.address, filters=[("state", "=", "ALIVE")], detail=True, timeout=20)
        return targets_from_actor_states(list(states))

    def handle(self, target: Target):
        return self.ray.get_actor(target.name, namespace=target.namespace)

    def worker_process(self, pid: int) -> psutil.Process:
        """The process of `pid` if it is a Ray worker under the server's process tree, started after
        the server; KillRefused otherwise."""
        try:
            p = psutil.Process(pid)
            ancestors = {a.pid for a in p.parents()}
            started = p.create_time()
            cmdline = " ".join(p.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied) as e:
            raise KillRefused(f"pid {pid}: {type(e).__name__}") from None
        if self.lab_netns:
            if _netns(pid) not in self.lab_netns:
                raise KillRefused(f"pid {pid} runs in none of the lab's hosts")
        elif self.server_pid not in ancestors:
            raise KillRefused(f"pid {pid} is not a descendant of the server (pid {self.server_pid})")
        if started < self.server_started and not self.lab_netns:
            raise KillRefused(f"pid {pid} started before the server")
        if not (cmdline.startswith("ray::") or "default_worker.py" in cmdline):
            raise KillRefused(f"pid {pid} is not a Ray worker: {cmdline[:80]!r}")
        return p


    def node_ips(self) -> dict[str, str]:
        """Ray node id -> the node's IP, for the nodes Ray knows (alive or not)."""
        return {n["NodeID"]: n["NodeManagerAddress"] for n in self.ray.nodes()}

    def routes(self, targets: list[Target], n: int = 1000) -> tuple[dict[str, Route] | None, str]:
        """The Conductor's latest decisions: request id -> (prefill node, decode node, decided at: its
        time.time()); None and why when it cannot say now (away, or no Conductor)."""
        conductor = next((t for t in targets if t.role == "conductor"), None)
        if conductor is None:
            return None, "no live Conductor"
        try:
            decisions = self.ray.get(self.handle(conductor).recent_decisions.remote(n), timeout=10)
        except Exception as e:  # noqa: BLE001 - a Conductor away (killed, restarting) cannot say
            return None, f"the Conductor's decisions: {type(e).__name__}: {e}"[:300]
        return {d.request_id: (d.prefill_node, d.decode_node, d.decided_at) for d in decisions}, ""


def _netns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def processes_left(markers: list[str]) -> list[int]:
    """Pids of live processes (not this one) whose command line names one of `markers`: the cluster's
    session folder (its GCS server, raylet, dashboard and agents) or GCS address. Workers rename
    themselves (`ray::DecodeNode`); the launcher finds those by the pids it saw under the server."""
    markers = [m for m in markers if m]
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if any(m in cmd for m in markers) and p.info["pid"] != os.getpid() \
                    and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return left
