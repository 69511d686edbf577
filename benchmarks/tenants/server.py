"""One `raypd serve` the benchmark starts, with or without tenant fairness, and its stop.

It runs on 127.0.0.1 and a port outside Ray's and the kernel's ranges, through
benchmarks/server_runs/serving.py: stopped on every way out of `started()`'s block, with the pids of
it still alive afterwards reported.
"""
from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from raypd.benchmarks.serve.ports import free_port
from raypd.benchmarks.serve.systems import Launched
from raypd.benchmarks.server_runs.serving import serving

NO_FAIRNESS_FLAG = "--no-tenant-fairness"


def serve_command(port: int, fairness: bool, serve_args: str) -> list[str]:
    return [sys.executable, "-m", "raypd", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
            *shlex.split(serve_args), *([] if fairness else [NO_FAIRNESS_FLAG])]


@contextmanager
def started(fairness: bool, serve_args: str, log_dir: Path, ready_timeout_s: float,
            on_stopped: Callable[[dict], None]) -> Iterator[Launched]:
    """A ready `raypd serve` (server_runs/serving.py); on leaving, it is stopped and on_stopped gets
    {fairness, command, log, processes_left_after}."""
    port = free_port()
    cmd = serve_command(port, fairness, serve_args)
    log = log_dir / f"raypd-serve-{'fair' if fairness else 'unfair'}.log"
    print(f"starting raypd serve {'with' if fairness else 'without'} tenant fairness on 127.0.0.1:{port} "
          f"(log in {log}) ...", file=sys.stderr, flush=True)

    def stopped(left: list[int]) -> None:
        print("stopped raypd serve" + (f"; still alive: {left}" if left else ""), file=sys.stderr, flush=True)
        on_stopped({"fairness": fairness, "command": "raypd " + shlex.join(cmd[3:]), "log": str(log),
                    "processes_left_after": left})
    with serving(cmd, port, log, ready_timeout_s, stopped) as launched:
        yield launched
