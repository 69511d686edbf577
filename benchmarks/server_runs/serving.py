"""serving(): one `raypd serve` process a benchmark started, ready inside the block and stopped on
every way out of it.

It runs with bench serve's launcher (benchmarks/serve/systems.py: its own process group, ready when
`/v1/models` answers, stopped by SIGTERM to its own process, then by group and by every pid seen
under it). The stop runs with Ctrl-C and SIGTERM ignored, so a second one cannot cut the clean-up
short; then `stopped` gets the pids still alive: the server's tree, and any process naming its Ray
cluster's address (the chaos bench's check).
"""
from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from raypd.benchmarks.chaos.ray_cluster import processes_left, wait_for_ray_address
from raypd.benchmarks.serve.systems import Launched


@contextmanager
def serving(cmd: list[str], port: int, log: Path, ready_timeout_s: float,
            stopped: Callable[[list[int]], None]) -> Iterator[Launched]:
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
        stopped(left)
