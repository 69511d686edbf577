"""`raypd bench chaos --lab`: the chaos run on a lab of network-namespace hosts (benchmarks/lab/), so
that a fault can take a whole host (`--targets host`) or cut its link (`--targets partition`).

    this process (root)                          the head host (namespace h0)
    build the lab: rack0 = h0 head, h1 prefill,
      h2 decode; rack1 = h3 prefill, h4 decode
    Ray on every host (role and rack labels,
      UCX_TLS=tcp,self: no same-machine shortcut)
    start `raypd bench chaos ... --lab-run FILE` ─> raypd serve --address HEAD:6379 --place-by-role,
                                                    the fault-free and chaos runs, role kills (as
    kill_host / cut / restore, asked over a pipe <─  without --lab); host faults asked of this process
    restore every link, close the lab (every       <─ exits (report written, server stopped)
      process, namespace and link, by pid and
      name), check nothing of it is left

The run itself must sit inside a host: the lab's addresses cannot be reached from outside it. The
host faults stay with the process that owns the lab (a link is a root-namespace device). The head
host is never a fault's target. Needs root (network namespaces); says why and exits 2 otherwise.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from raypd.benchmarks.chaos.killer import KillFailed
from raypd.benchmarks.lab.hosts import Lab, LabError, LabSpec, LabUnavailable
from raypd.benchmarks.lab.ray_hosts import NETWORK_ONLY, PD_RACKS, PD_ROLES, start_ray
from raypd.benchmarks.server_runs.interrupts import Terminated, raise_terminated

CPUS_PER_HOST = 2          # room for both nodes of a role on one host, once the other host is lost
STOP_S = 240.0             # for the run inside the head host to stop its server and write its report


@dataclass(frozen=True, slots=True)
class LabHost:
    name: str        # h1 .. h4
    role: str        # its raypd.io/role label
    rack: int
    ip: str
    namespace: str


@dataclass(frozen=True, slots=True)
class LabRun:
    """What the run inside the head host is told (a JSON file): the Ray address, the hosts a fault may
    hit, and the two pipe ends it asks the lab's owner through."""
    address: str
    head_ip: str
    hosts: tuple[LabHost, ...]
    ask_fd: int
    answer_fd: int

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> LabRun:
        d = json.loads(path.read_text())
        return cls(d["address"], d["head_ip"], tuple(LabHost(**h) for h in d["hosts"]), d["ask_fd"], d["answer_fd"])

    def netns(self) -> frozenset[str]:
        """The hosts' network namespaces as /proc/PID/ns/net names them ("net:[INODE]"), head included."""
        out = {f"net:[{os.stat(f'/run/netns/{h.namespace}').st_ino}]" for h in self.hosts}
        return frozenset(out | {os.readlink("/proc/self/ns/net")})


class LabFaults:
    """killer.HostFaults inside the head host: each fault is one JSON line to the lab's owner and
    one answer back (a lock keeps a partition's restore and a kill from interleaving)."""

    def __init__(self, run: LabRun):
        self.hosts = run.hosts
        self._ask = os.fdopen(run.ask_fd, "w", buffering=1)
        self._answer = os.fdopen(run.answer_fd, "r")
        self._lock = threading.Lock()

    def _call(self, op: str, name: str) -> dict:
        with self._lock:
            self._ask.write(json.dumps({"op": op, "host": name}) + "\n")
            line = self._answer.readline()
        if not line:
            raise KillFailed("the lab's owner is gone")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise KillFailed(f"{op} {name}: {answer.get('error')}")
        return answer

    def kill_host(self, name: str) -> int:
        return int(self._call("kill_host", name)["killed"])

    def cut(self, name: str) -> None:
        self._call("cut", name)

    def restore(self, name: str) -> None:
        self._call("restore", name)


# -- the lab's owner -----------------------------------------------------------------------------------
def run_on_lab(argv: list[str], json_path: Path | None) -> int:
    """Build the lab, start Ray on it, run the bench inside the head host with `argv` (this command's
    own flags), do its host faults; close the lab on every exit path. The exit status."""
    lab = Lab(LabSpec(hosts_per_rack=PD_RACKS))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, raise_terminated)
    status = 1
    cut: set[str] = set()
    inner: subprocess.Popen | None = None
    try:
        try:
            lab.build()
        except LabUnavailable as e:
            print(f"raypd bench chaos: error: --lab needs network namespaces: {e}", file=sys.stderr)
            return 2
        print(f"lab: {len(lab.hosts)} hosts in racks {list(PD_RACKS)}; starting Ray on each ...",
              file=sys.stderr, flush=True)
        lab_ray = start_ray(lab, PD_ROLES, cpus_per_host=CPUS_PER_HOST, extra_env=NETWORK_ONLY)
        head = lab.hosts[0]
        hosts = {f"h{h.index}": h for h in lab.hosts[1:]}
        ask_r, ask_w = os.pipe()
        answer_r, answer_w = os.pipe()
        run = LabRun(lab_ray.address, head.ip, tuple(LabHost(name, PD_ROLES[h.index], h.rack, h.ip, h.namespace)
                                                     for name, h in hosts.items()), ask_w, answer_r)
        run_file = lab.folder / "chaos-lab-run.json"
        run.write(run_file)
        inner = lab.popen(head, [sys.executable, "-m", "raypd", "bench", "chaos", *argv, "--lab-run", str(run_file)],
                          env=lab_ray.driver_env(), pass_fds=(ask_w, answer_r))
        os.close(ask_w)
        os.close(answer_r)
        with os.fdopen(ask_r, "r") as asks, os.fdopen(answer_w, "w", buffering=1) as answers:
            for line in asks:   # until the run closes its end (it exited)
                answers.write(json.dumps(_do(lab, hosts, cut, json.loads(line))) + "\n")
        status = inner.wait()
    except (KeyboardInterrupt, Terminated):
        print("raypd bench chaos: interrupted; stopping the run and the lab", file=sys.stderr)
        status = 130
    except LabError as e:
        print(f"raypd bench chaos: error: the lab: {e}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the clean-up must not be cut short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if inner is not None and inner.poll() is None:
            inner.send_signal(signal.SIGTERM)   # it stops its server and writes what it has
            try:
                inner.wait(STOP_S)
            except subprocess.TimeoutExpired:
                pass
        for name in sorted(cut):
            _restore(lab, hosts[name])
        lab.close()
        left = _lab_left(lab)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if left:
        print(f"raypd bench chaos: the lab left {left}", file=sys.stderr)
        status = status or 1
    if json_path is not None and json_path.exists():
        report = json.loads(json_path.read_text())
        report["lab_left_after"] = left
        json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return status


def _do(lab, hosts: dict, cut: set[str], ask: dict) -> dict:
    host = hosts.get(ask.get("host"))
    if host is None:   # the head host is not among them: never a target
        return {"ok": False, "error": f"no such host (the head host is never a target): {ask.get('host')}"}
    try:
        if ask["op"] == "kill_host":
            return {"ok": True, "killed": len(lab.kill_host(host))}
        if ask["op"] == "cut":
            lab.cut(host)
            cut.add(ask["host"])
        elif ask["op"] == "restore":
            lab.restore(host)
            cut.discard(ask["host"])
        else:
            return {"ok": False, "error": f"unknown op {ask['op']!r}"}
    except Exception as e:  # noqa: BLE001 - told to the run, which records the fault as not done
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"ok": True, "at": time.time()}


def _restore(lab, host) -> None:
    try:
        lab.restore(host)
    except Exception as e:  # noqa: BLE001 - the lab's close removes the link anyway
        print(f"raypd bench chaos: restoring {host.link} failed: {e}", file=sys.stderr)


def _lab_left(lab) -> dict[str, list]:
    """What of the lab still exists after close(): namespaces, links, processes in them."""
    left: dict[str, list] = {}
    if namespaces := lab.namespaces():
        left["namespaces"] = namespaces
        left["pids"] = [p for ns in namespaces for p in lab.pids_in(ns)]
    if links := lab.links():
        left["links"] = links
    return left
