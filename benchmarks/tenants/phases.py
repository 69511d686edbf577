"""The phases of one `raypd bench tenants` run and the traffic of each, as data (no I/O).

    phase         server                     stream a (interactive)            stream b (flood)
    a_alone       tenant fairness on         tenant-a, priority 0, A's rate    -
    flood_fair    tenant fairness on         tenant-a, priority 0, A's rate    tenant-b, priority 0, B's rate
    priority      tenant fairness on         one-tenant, priority -1           one-tenant, priority 0, B's rate
    flood_unfair  --no-tenant-fairness       tenant-a, priority 0, A's rate    tenant-b, priority 0, B's rate

The phases run in this order, the first three on one server and the last on a second server started
with the same flags plus `--no-tenant-fairness`. In `priority` both streams are one tenant's, so
fairness cannot help: only the priority puts A ahead. A's rate is a modest fraction of the measured
capacity and B's a multiple of it (main.py's --a-load, --b-load).

Within a phase B starts at 0 and A at `lead_s`, so A's requests meet a flood that has already filled
the queues; A's schedule is the same in every phase (same times, same seed), so its figures compare.
A sends at a fixed interval (steady) or Poisson arrivals; B's are Poisson. Each (phase, stream) has
its own seed, so no two phases send the same prompts and no phase is helped by another's cache.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

Arrivals = Literal["fixed", "poisson"]
PHASES = ("a_alone", "flood_fair", "priority", "flood_unfair")
# Past this many requests in one phase a flag is wrong, not a benchmark (a phase is minutes long).
MAX_REQUESTS_PER_PHASE = 50_000


class PlanError(ValueError):
    """Rates or durations that make no run; the message names the flag."""


@dataclass(frozen=True)
class Stream:
    name: str          # "a" (interactive) or "b" (flood)
    tenant: str        # sent as x-raypd-tenant
    priority: int      # sent as the body's `priority` (lower is more urgent)
    rate: float        # requests per second
    arrivals: Arrivals
    seed: int
    start_s: float = 0.0  # the first arrival is at or after this, from the phase's start

    def arrival_times(self, duration_s: float) -> list[float]:
        """Send times in [start_s, duration_s), seconds from the phase's start."""
        span = duration_s - self.start_s
        if span <= 0:
            return []
        if self.arrivals == "fixed":
            return [self.start_s + i / self.rate for i in range(math.ceil(span * self.rate))]
        rng = random.Random(self.seed)
        out: list[float] = []
        t = self.start_s + rng.expovariate(self.rate)
        while t < duration_s:
            out.append(t)
            t += rng.expovariate(self.rate)
        return out


@dataclass(frozen=True)
class Phase:
    name: str
    fairness: bool     # True: the server with tenant fairness; False: the one started with --no-tenant-fairness
    streams: tuple[Stream, ...]

    def stream(self, name: str) -> Stream | None:
        return next((s for s in self.streams if s.name == name), None)


def plan_phases(a_rate: float, b_rate: float, duration_s: float, lead_s: float, a_arrivals: Arrivals = "fixed",
                seed: int = 0) -> list[Phase]:
    """The four phases, in the order they run."""
    if not (a_rate > 0 and b_rate > 0):
        raise PlanError(f"A's and B's rates must be > 0 (got {a_rate:g} and {b_rate:g} req/s): "
                        "check --capacity, --a-load and --b-load")
    if not 0 <= lead_s < duration_s:
        raise PlanError("--flood-lead must be >= 0 and shorter than --phase-duration")
    if a_arrivals not in ("fixed", "poisson"):
        raise PlanError(f"--a-arrivals must be fixed or poisson, not {a_arrivals!r}")

    def a(tenant: str, priority: int = 0) -> Stream:  # A's schedule is the same in every phase
        return Stream("a", tenant, priority, a_rate, a_arrivals, seed, lead_s)

    def b(tenant: str, phase: int) -> Stream:
        return Stream("b", tenant, 0, b_rate, "poisson", seed + 1000 * (phase + 1))

    phases = [Phase("a_alone", True, (a("tenant-a"),)),
              Phase("flood_fair", True, (a("tenant-a"), b("tenant-b", 1))),
              Phase("priority", True, (a("one-tenant", priority=-1), b("one-tenant", 2))),
              Phase("flood_unfair", False, (a("tenant-a"), b("tenant-b", 3)))]
    for p in phases:
        n = sum(len(s.arrival_times(duration_s)) for s in p.streams)
        if n > MAX_REQUESTS_PER_PHASE:
            raise PlanError(f"phase {p.name} would send {n} requests (at most {MAX_REQUESTS_PER_PHASE}): "
                            "lower --phase-duration, --b-load or --capacity")
    return phases


def request_seed(phase: Phase, stream: Stream) -> int:
    """The seed of the prompts a stream sends in a phase: its own, so no prompt repeats across phases."""
    return stream.seed * 7919 + PHASES.index(phase.name) * 104_729 + (0 if stream.name == "a" else 1)
