"""Every few seconds, each server process's resident memory, open file descriptors and threads.

A process is one Series, keyed by pid (a restarted actor is a new process and a new series); its
role is read again at each sample, because a Ray worker renames itself when it takes an actor
(ray::IDLE -> ray::PrefillNode). A process that was not alive at a sample has no value there: each
series keeps its own sample times.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil

from raypd.benchmarks.soak.processes import role_of, session_members, unique_labels

_SESSION_DIR = re.compile(r"(/[^\s=]*/session_[^/\s]+)")


@dataclass(slots=True)
class Series:
    pid: int
    role: str
    cmdline: str
    started: float                          # psutil create_time()
    name: str | None = None                 # the actor name the server reported for this pid
    t_s: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)       # bytes
    fds: list[int] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name or self.role


class ProcessSampler:
    def __init__(self, server_pid: int, markers: Callable[[], Iterable[str]] = lambda: ()):
        self.server_pid = server_pid
        self.markers = markers
        self.series: dict[int, Series] = {}
        self.times: list[float] = []

    def sample(self, t_s: float, names: dict[int, str] | None = None) -> int:
        """Read every member alive now at time `t_s` (seconds on the caller's clock); `names` maps pids
        to actor names. Returns how many processes were read."""
        read = 0
        for pid, proc in session_members(self.server_pid, self.markers()).items():
            try:
                with proc.oneshot():
                    cmdline = proc.cmdline()
                    started = proc.create_time()
                    rss = proc.memory_info().rss
                    fds = proc.num_fds()
                    threads = proc.num_threads()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            s = self.series.get(pid)
            if s is None or s.started != started:  # a new process (a reused pid starts a new series)
                s = self.series[pid] = Series(pid, "", "", started)
            s.role = role_of(cmdline, pid, self.server_pid)
            s.cmdline = " ".join(cmdline)[:300]
            if names and pid in names:
                s.name = names[pid]
            s.t_s.append(t_s)
            s.rss.append(rss)
            s.fds.append(fds)
            s.threads.append(threads)
            read += 1
        self.times.append(t_s)
        return read

    def reset(self) -> None:
        """Forget the samples (what was learnt of each process stays: its role, name, command line)."""
        for s in self.series.values():
            s.t_s.clear()
            s.rss.clear()
            s.fds.clear()
            s.threads.clear()
        self.times.clear()

    def labelled(self) -> dict[str, Series]:
        """Every series with samples, by a unique label (its actor name or role; #2, #3 ... for repeats)."""
        sampled = {pid: s for pid, s in self.series.items() if s.t_s}
        labels = unique_labels({pid: s.label for pid, s in sampled.items()},
                               {pid: s.started for pid, s in sampled.items()})
        return {labels[pid]: s for pid, s in sorted(sampled.items(), key=lambda kv: labels[kv[0]])}

    def session_dir(self) -> str | None:
        """The Ray session folder named on a member's command line (the GCS server's and raylet's)."""
        for s in self.series.values():
            m = _SESSION_DIR.search(s.cmdline)
            if m:
                return m.group(1)
        return None
