"""One `raypd serve` the benchmark starts, with or without tenant fairness, and its stop.

It runs with bench serve's launcher (benchmarks/serve/systems.py: its own process group, ready when
`/v1/models` answers, stopped by SIGTERM to its own process, then by group and by every pid seen
under it) on 127.0.0.1 and a port outside Ray's and the kernel's ranges. `started()` stops it on
every way out of its block, Ctrl-C and SIGTERM included (both are ignored while it stops, so a
second one cannot cut the clean-up short), and reports the pids of it still alive afterwards: its
tree, and any process naming its Ray cluster's address (the chaos bench's check).
"""
from __future__ import annotations

import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from raypd.benchmarks.chaos.ray_cluster import processes_left, wait_for_ray_address
from raypd.benchmarks.serve.ports import free_port
from raypd.benchmarks.serve.systems import Launched

NO_FAIRNESS_FLAG = "--no-tenant-fairness"


def serve_command(port: int, fairness: bool, serve_args: str) -> list[str]:
    return [sys.executable, "-m", "raypd", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
            *shlex.split(serve_args), *([] if fairness else [NO_FAIRNESS_FLAG])]


@contextmanager
def started(fairness: bool, serve_args: str, log_dir: Path, ready_timeout_s: float,
            on_stopped: Callable[[dict], None]) -> Iterator[Launched]:
    """A ready `raypd serve`; on leaving, it is stopped and on_stopped gets {fairness, command, log,
    processes_left_after}."""
    port = free_port()
    cmd = serve_command(port, fairness, serve_args)
    log = log_dir / f"raypd-serve-{'fair' if fairness else 'unfair'}.log"
    print(f"starting raypd serve {'with' if fairness else 'without'} tenant fairness on 127.0.0.1:{port} "
          f"(log in {log}) ...", file=sys.stderr, flush=True)
    launched = Launched.start("raypd serve", cmd, port, log)
    address = ""
    try:
        launched.wait_ready(ready_timeout_s)
        address = wait_for_ray_address(launched, 60.0)
        launched.remember()
        yield launched
    finally:
        handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            left = sorted(set(launched.stop()) | set(processes_left([address])))
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        print("stopped raypd serve" + (f"; still alive: {left}" if left else ""), file=sys.stderr, flush=True)
        on_stopped({"fairness": fairness, "command": "raypd " + shlex.join(cmd[3:]), "log": str(log),
                    "processes_left_after": left})
