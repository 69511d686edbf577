"""The `raypd serve` processes the benchmark starts, and their stop.

Two commands of the same flags (--serve-args, the node count, the SLO targets' server side):
    calibration   --mixed-nodes MIN, no autoscaling: one node's capacity is measured on a pool that
                  cannot grow (run.py), so the probe's overload neither inflates it nor leaves extra
                  nodes behind for the load step; only when --base-rate is not given
    autoscale     --mixed-nodes MIN --autoscale mixed=MIN:MAX --autoscale-ttft S --autoscale-tpot S
                  [--autoscale-attainment SHARE] [--autoscale-window S]; with --no-autoscale the same
                  pool without the --autoscale flags (the fixed pool, the control run)

Each runs on 127.0.0.1 and a port outside Ray's and the kernel's ranges, through
benchmarks/server_runs/serving.py: stopped on every way out of `started()`'s block, with the pids of
it still alive afterwards reported.
"""
from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from raypd.benchmarks.serve.ports import free_port
from raypd.benchmarks.serve.systems import Launched
from raypd.benchmarks.server_runs.serving import serving

ROLE = "mixed"
SERVER_ATTAINMENT = 0.9  # raypd serve's default --autoscale-attainment


@dataclass(frozen=True)
class PoolSpec:
    least: int                  # nodes at the start and the autoscaler's minimum
    most: int                   # the autoscaler's maximum
    ttft_s: float               # the SLO targets, the same for the server and the client
    tpot_s: float
    window_s: float | None = None   # --autoscale-window; None: the server's default
    autoscale: bool = True      # False: the fixed pool of `least` nodes (the control run)
    attainment: float = SERVER_ATTAINMENT   # passed (--autoscale-attainment) only when not the server's default

    def flags(self, calibration: bool = False) -> list[str]:
        out = ["--mixed-nodes", str(self.least)]
        if calibration or not self.autoscale:
            return out
        out += ["--autoscale", f"{ROLE}={self.least}:{self.most}", "--autoscale-ttft", f"{self.ttft_s:g}",
                "--autoscale-tpot", f"{self.tpot_s:g}"]
        if self.attainment != SERVER_ATTAINMENT:
            out += ["--autoscale-attainment", f"{self.attainment:g}"]
        return out + ([] if self.window_s is None else ["--autoscale-window", f"{self.window_s:g}"])


def serve_command(port: int, pool: PoolSpec, serve_args: str, calibration: bool = False) -> list[str]:
    return [sys.executable, "-m", "raypd", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
            *pool.flags(calibration), *shlex.split(serve_args)]


@contextmanager
def started(label: str, pool: PoolSpec, serve_args: str, log_dir: Path, ready_timeout_s: float,
            on_stopped: Callable[[dict], None], calibration: bool = False) -> Iterator[Launched]:
    """A ready `raypd serve` (server_runs/serving.py); on leaving, it is stopped and on_stopped gets
    {label, command, log, processes_left_after}."""
    port = free_port()
    cmd = serve_command(port, pool, serve_args, calibration)
    log = log_dir / f"raypd-serve-{label}.log"
    print(f"starting raypd serve ({label}) on 127.0.0.1:{port} (log in {log}) ...", file=sys.stderr, flush=True)

    def stopped(left: list[int]) -> None:
        print(f"stopped raypd serve ({label})" + (f"; still alive: {left}" if left else ""), file=sys.stderr,
              flush=True)
        on_stopped({"label": label, "command": "raypd " + shlex.join(cmd[3:]), "log": str(log),
                    "processes_left_after": left})
    with serving(cmd, port, log, ready_timeout_s, stopped) as launched:
        yield launched
