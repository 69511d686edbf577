"""Ports a launched server is told to listen on, picked so that nothing else on this machine is handed them.

The kernel gives every bind to port 0 (and every outgoing connection) a port from its ephemeral range
(net.ipv4.ip_local_port_range, 32768-60999 by default), and Ray takes several that way while it starts:
its raylet's, agents' and workers' gRPC servers. A server port picked from that range is free when picked
and can be Ray's by the time the server binds it; the launcher then polls a gRPC server. (CI saw this: a
soak run's readiness poll read an HTTP/2 frame.) Ray's worker ports are 10002-19999, so a server port is
picked above those and below the ephemeral range, at random, so two launchers rarely try the same one.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path

RAY_WORKER_PORTS = range(10002, 20000)
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = range(32768, 61000)
TRIES = 200


def ephemeral_ports() -> range:
    try:
        low, high = (int(v) for v in EPHEMERAL_RANGE_FILE.read_text().split())
        return range(low, high + 1)
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def candidate_ports(low: int = RAY_WORKER_PORTS.stop, high: int = 65535) -> list[int]:
    """Ports in [low, high] that neither the kernel's ephemeral range nor Ray's worker range holds."""
    taken = ephemeral_ports()
    return [p for p in range(low, high + 1) if p not in taken and p not in RAY_WORKER_PORTS]


def free_port(low: int = RAY_WORKER_PORTS.stop, high: int = 65535, host: str = "127.0.0.1") -> int:
    """A port in [low, high], outside the ephemeral and Ray worker ranges, that binds now on `host`."""
    candidates = candidate_ports(low, high)
    for port in random.sample(candidates, min(TRIES, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{high} outside the ephemeral range {ephemeral_ports()} "
                       f"and Ray's worker ports {RAY_WORKER_PORTS}")
