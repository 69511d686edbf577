"""The processes of one started `raypd serve`, found with psutil and named by role.

Members: the server process and every process in its session (the launcher starts it with
start_new_session, so the session id is the server's pid; Ray's workers get process groups of their
own but stay in the session), plus its descendants and any process whose command line names one of
`markers` (the Ray session folder or GCS address), for a daemon that left both.

Role, from the command line (the method a Ray actor is running is dropped):

    the server's pid                              serve-cli
    .../gcs_server ...                            gcs
    .../raylet ...                                raylet
    ray::PrefillNode.attach_conductor             PrefillNode (any actor: its class)
    ray::ServeReplica:raypd:OpenAIIngress.x       OpenAIIngress (a Serve replica: its deployment)
    ray::IDLE                                     idle-worker
    ray-dashboard-NodeHead-0 (...)                dashboard:NodeHead
    .../ray/dashboard/dashboard.py                dashboard
    .../autoscaler/_private/monitor.py            autoscaler-monitor
    .../_private/log_monitor.py                   log-monitor
    ... multiprocessing.forkserver / resource_tracker  forkserver / resource-tracker
    anything else                                 the program's file name

A node actor whose pid the server reports (`/admin/nodes`) is named by its actor name instead
(raypd-prefill-0). `unique_labels` appends #2, #3 ... to repeated labels, oldest process first.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable

import psutil

_DASHBOARD_MODULE = re.compile(r"^ray-dashboard-(\w+?)-\d+\b")
_SCRIPTS = (("gcs_server", "gcs"), ("/raylet", "raylet"), ("dashboard/dashboard.py", "dashboard"),
            ("autoscaler/_private/monitor.py", "autoscaler-monitor"), ("log_monitor.py", "log-monitor"),
            ("multiprocessing.forkserver", "forkserver"), ("multiprocessing.resource_tracker", "resource-tracker"))


def role_of(cmdline: list[str], pid: int, server_pid: int) -> str:
    """The role of one process from its command line (see the table above)."""
    if pid == server_pid:
        return "serve-cli"
    cmd = " ".join(cmdline)
    if cmd.startswith("ray::"):
        actor = cmd[5:].split()[0] if cmd[5:].strip() else "worker"
        actor = actor.split(".")[0]
        if actor.startswith("ServeReplica:"):
            actor = actor.rsplit(":", 1)[-1]
        return "idle-worker" if actor == "IDLE" else actor
    m = _DASHBOARD_MODULE.match(cmd)
    if m:
        return f"dashboard:{m.group(1)}"
    for needle, role in _SCRIPTS:
        if needle in cmd:
            return role
    if "default_worker.py" in cmd:
        return "worker"
    return os.path.basename(cmdline[0]) if cmdline else f"pid-{pid}"


def session_members(server_pid: int, markers: Iterable[str] = ()) -> dict[int, psutil.Process]:
    """The server's processes alive now, by pid (zombies left out)."""
    marks = [m for m in markers if m]
    found: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(server_pid)
        found[server_pid] = root
        for p in root.children(recursive=True):
            found[p.pid] = p
    except psutil.NoSuchProcess:
        return {}
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline"]):
        pid = p.info["pid"]
        if pid in found or pid == me:
            continue
        try:
            in_session = os.getsid(pid) == server_pid
        except OSError:
            continue
        if in_session or (marks and any(m in " ".join(p.info["cmdline"] or []) for m in marks)):
            found[pid] = p
    out = {}
    for pid, p in found.items():
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out[pid] = p
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def unique_labels(labels: dict[int, str], started: dict[int, float]) -> dict[int, str]:
    """pid -> its label, made unique: the second and later processes of a label (by start time, then
    pid) get #2, #3, ..."""
    seen: dict[str, int] = {}
    out = {}
    for pid in sorted(labels, key=lambda p: (started.get(p, 0.0), p)):
        n = seen[labels[pid]] = seen.get(labels[pid], 0) + 1
        out[pid] = labels[pid] if n == 1 else f"{labels[pid]}#{n}"
    return out
