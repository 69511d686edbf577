"""A lab of hosts on this machine: Linux network namespaces on bridges, for tests and benchmarks of
raypd across hosts (not a user feature).

Each host is a network namespace with its own loopback, one interface `eth0` (a veth whose other end
is on its rack's bridge) and one address; processes in different hosts reach each other only over
those links, never by 127.0.0.1. Racks are bridges; rack i's bridge and rack i+1's are joined by a
veth pair whose two ends are rate-limited by a token bucket (`tc tbf`: this kernel has no netem, so
rates but no delays). Every address is in 198.18.0.0/15, the range reserved for benchmarking, on
bridges attached to no physical interface, so nothing leaves the machine.

    Lab(...) ─build()─> BUILT ─close()─> CLOSED
                 └ a failed step closes what was made, then raises

close() removes exactly what this lab made, by name and pid: every process still running in one of
its namespaces (whatever started it: `ray start` daemonizes), then the namespaces, then the links
and bridges, then the lab's folder (`folder`: the hosts share this machine's file system, so
whatever a host keeps on disk, Ray's sessions and sockets, goes under its own subfolder there). It runs on every exit path of `with Lab(...)` and at interpreter exit. Names carry a
per-lab tag, so two labs (or a stale one from a killed run) never touch each other's parts.
"""
from __future__ import annotations

import atexit
import enum
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# The benchmarking range (RFC 2544); a lab's hosts share one /16 of it (racks are one L2 segment).
NETWORK = ipaddress.IPv4Network("198.18.0.0/16")
assert NETWORK.subnet_of(ipaddress.IPv4Network("198.18.0.0/15"))
COMMAND_TIMEOUT_S = 10.0


class LabUnavailable(RuntimeError):
    """This machine cannot make namespaces (not root, no `ip` or no netns support); says why."""


class LabError(RuntimeError):
    """A step of building or operating the lab failed; the message has the command and its stderr."""


class LabState(enum.IntEnum):
    NEW = 0
    BUILT = 1
    CLOSED = 2


@dataclass(frozen=True, slots=True)
class Host:
    index: int        # 0 .. n-1 across racks, in order
    rack: int
    namespace: str    # `ip netns` name
    link: str         # the host side of its veth (on the rack's bridge): down = the host is cut off
    ip: str

    @property
    def exec_prefix(self) -> list[str]:
        """Prefix that runs a command inside this host."""
        return ["ip", "netns", "exec", self.namespace]


@dataclass(frozen=True, slots=True)
class LabSpec:
    hosts_per_rack: Sequence[int] = (2,)
    cross_rack_rate: str = "100mbit"      # tc rate of each link between two racks' bridges
    tag: str = field(default_factory=lambda: secrets.token_hex(2))   # in every name this lab makes

    def __post_init__(self):
        if not self.hosts_per_rack or min(self.hosts_per_rack) < 1 or sum(self.hosts_per_rack) > 200:
            raise ValueError(f"hosts_per_rack must name 1-200 hosts in all, got {list(self.hosts_per_rack)}")
        if len(self.hosts_per_rack) > 200 or not self.tag.isalnum() or len(self.tag) > 4:
            raise ValueError(f"bad rack count or tag {self.tag!r} (tag: up to 4 letters or digits)")


def unavailable_reason() -> str | None:
    """Why a lab cannot be built here, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if not os.path.isdir("/proc/self/ns") or not os.path.exists("/proc/self/ns/net"):
        return "this kernel has no network namespaces"
    return None


class Lab:
    """Build with `with Lab(LabSpec(...)) as lab:`; hosts in `lab.hosts`."""

    def __init__(self, spec: LabSpec = LabSpec()):
        self.spec = spec
        self.state = LabState.NEW
        self.prefix = f"rl{spec.tag}"            # links: rlTAG-b0 (bridge), rlTAG-h3 (host 3), rlTAG-x0a/x0b
        self.hosts: list[Host] = []
        self.bridges: list[str] = []
        self.rack_links: list[tuple[str, str]] = []
        self._started: list[subprocess.Popen] = []
        self.folder = Path("/nonexistent")      # made by build(): short, since Ray puts sockets under it

    # lifecycle
    def __enter__(self) -> Lab:
        self.build()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def build(self) -> None:
        assert self.state is LabState.NEW, self.state
        if (why := unavailable_reason()) is not None:
            raise LabUnavailable(why)
        atexit.register(self.close)
        try:
            self.folder = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-", dir="/tmp"))
            self._build()
        except BaseException:
            self.close()
            raise
        self.state = LabState.BUILT

    def _build(self) -> None:
        for rack in range(len(self.spec.hosts_per_rack)):
            bridge = f"{self.prefix}-b{rack}"
            self.bridges.append(bridge)
            _ip("link", "add", bridge, "type", "bridge")
            _ip("link", "set", bridge, "up")
        for rack in range(1, len(self.bridges)):   # a chain of racks, each link rate-limited both ways
            a, b = f"{self.prefix}-x{rack}a", f"{self.prefix}-x{rack}b"
            self.rack_links.append((a, b))
            _ip("link", "add", a, "type", "veth", "peer", "name", b)
            for end, bridge in ((a, self.bridges[rack - 1]), (b, self.bridges[rack])):
                _ip("link", "set", end, "master", bridge, "up")
                _run(["tc", "qdisc", "add", "dev", end, "root", "tbf", "rate", self.spec.cross_rack_rate,
                      "burst", "64kb", "latency", "100ms"])
        index = 0
        for rack, count in enumerate(self.spec.hosts_per_rack):
            for _ in range(count):
                self.hosts.append(self._add_host(index, rack))
                index += 1

    def _add_host(self, index: int, rack: int) -> Host:
        ip = str(NETWORK.network_address + (rack << 8) + 10 + index)
        host = Host(index, rack, f"raypd-lab-{self.spec.tag}-h{index}", f"{self.prefix}-h{index}", ip)
        peer = f"{self.prefix}-p{index}"
        _ip("netns", "add", host.namespace)
        _ip("link", "add", host.link, "type", "veth", "peer", "name", peer, "netns", host.namespace)
        _ip("link", "set", host.link, "master", self.bridges[rack], "up")
        ns = ["-n", host.namespace]
        _ip(*ns, "link", "set", peer, "name", "eth0")
        _ip(*ns, "addr", "add", f"{ip}/{NETWORK.prefixlen}", "dev", "eth0")
        _ip(*ns, "link", "set", "eth0", "up")
        _ip(*ns, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        """Remove everything this lab made; safe to call more than once and on a half-built lab."""
        if self.state is LabState.CLOSED:
            return
        self.state = LabState.CLOSED
        atexit.unregister(self.close)
        for proc in self._started:
            if proc.poll() is None:
                _kill(proc.pid)
        for ns in self.namespaces():
            _kill_all(self.pids_in(ns))
        for ns in self.namespaces():
            deadline = time.monotonic() + 10
            while self.pids_in(ns) and time.monotonic() < deadline:
                time.sleep(0.05)
            _ip("netns", "delete", ns, check=False)
        for link in self.links():   # a namespace's deletion took its veth pairs; bridges and rack links stay
            _ip("link", "delete", link, check=False)
        for proc in self._started:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if self.folder.name.startswith(f"{self.prefix}-"):
            shutil.rmtree(self.folder, ignore_errors=True)

    def host_folder(self, host: Host) -> Path:
        """A folder of the host's own (its "disk"), removed at close()."""
        path = self.folder / f"h{host.index}"
        path.mkdir(exist_ok=True)
        return path

    # what exists
    def namespaces(self) -> list[str]:
        """This lab's namespaces that exist now."""
        out = _run(["ip", "netns", "list"], check=False).stdout
        mine = f"raypd-lab-{self.spec.tag}-h"
        return [line.split()[0] for line in out.splitlines() if line.startswith(mine)]

    def links(self) -> list[str]:
        """This lab's links in the root namespace that exist now (bridges, rack links, host veths)."""
        out = _run(["ip", "-o", "link", "show"], check=False).stdout
        names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
        return [n for n in names if n.startswith(f"{self.prefix}-")]

    def titles(self, host: Host) -> list[str]:
        """What runs in the host now: each process's title (its argv[0]; Ray's workers set theirs
        to ray::<Actor>.<method>)."""
        out = []
        for pid in self.pids_in(host.namespace):
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace"))
            except OSError:  # gone meanwhile
                pass
        return out

    @staticmethod
    def pids_in(namespace: str) -> list[int]:
        out = _run(["ip", "netns", "pids", namespace], check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    # operating it
    def popen(self, host: Host, argv: Sequence[str], env: dict[str, str] | None = None,
              **kwargs) -> subprocess.Popen:
        """Start argv inside `host`; it and anything it leaves in the namespace go at close()."""
        assert self.state is LabState.BUILT, self.state
        proc = subprocess.Popen([*host.exec_prefix, *argv], env=env, **kwargs)
        self._started.append(proc)
        return proc

    def run(self, host: Host, argv: Sequence[str], timeout_s: float = 60.0, env: dict[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run argv inside `host` to completion; its stdout and stderr as text."""
        assert self.state is LabState.BUILT, self.state
        return _run([*host.exec_prefix, *argv], timeout_s=timeout_s, env=env, check=check)

    def cut(self, host: Host) -> None:
        """Take the host's link down: a partition (its processes live on, unreachable)."""
        _ip("link", "set", host.link, "down")

    def restore(self, host: Host) -> None:
        _ip("link", "set", host.link, "up")

    def kill_host(self, host: Host) -> list[int]:
        """Every process running in the host, SIGKILLed at once: the machine lost (its link stays up,
        with nothing behind it). Returns the pids."""
        return _kill_all(self.pids_in(host.namespace))


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check=check)


def _run(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S, env: dict[str, str] | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        raise LabError(f"`{' '.join(argv)}` did not finish within {timeout_s:.0f} s") from e
    if check and done.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    return done


def _kill_all(pids: list[int]) -> list[int]:
    for pid in pids:
        _kill(pid)
    return pids


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
