"""server_runs(): the block in which a benchmark runs its `raypd serve` servers, and the exit status
that comes out of it, the same for every bench that starts servers.

Inside the block SIGTERM raises Terminated (interrupts.py). A listed error (a server that did not
start, no capacity, a bad plan) ends the runs early: its message printed and noted, status 1.
Ctrl-C or SIGTERM: status 130. Either way the servers were stopped by then (serving()), and any of
their processes still alive afterwards is printed and noted, status 1 at least.
"""
from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from raypd.benchmarks.server_runs.interrupts import Terminated, raise_terminated


@dataclass(slots=True)
class RunsOutcome:
    status: int = 0   # 0 done, 1 stopped early or a process left, 130 interrupted


@contextmanager
def server_runs(bench: str, servers: list[dict], notes: list[str],
                errors: tuple[type[Exception], ...]) -> Iterator[RunsOutcome]:
    """`servers`: each run's record (with "processes_left_after"), as serving()'s callers append them."""
    outcome = RunsOutcome()
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield outcome
    except errors as e:
        print(f"raypd bench {bench}: error: {e}", file=sys.stderr)
        notes.append(f"the run stopped early: {e}")
        outcome.status = 1
    except (KeyboardInterrupt, Terminated):
        print(f"raypd bench {bench}: interrupted; the servers were stopped", file=sys.stderr)
        notes.append("interrupted")
        outcome.status = 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    left = [pid for s in servers for pid in s["processes_left_after"]]
    if left:
        print(f"raypd bench {bench}: processes of the servers still alive: {left}", file=sys.stderr)
        notes.append(f"processes of the servers were still alive after stopping them: {left}")
        outcome.status = outcome.status or 1
