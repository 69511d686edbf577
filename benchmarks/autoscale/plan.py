"""The load step as data (no I/O): three phases back to back, each with its rate and its seeded
Poisson arrivals, times in seconds from the warm phase's start (the run's t = 0).

    phase   starts at            lasts        rate
    warm    0                    warm_s       base
    step    warm_s               step_s       base x step_factor   (3 by default)
    cool    warm_s + step_s      cool_s       base

The base rate is one that a single node serves within the SLOs (run.py derives it from one node's
measured capacity, main.py's --base-load; --base-rate gives it), so the step overloads the pool's
minimum and needs more nodes; the cool-down is long enough for the pool to shrink again while
requests still arrive (the scale-down must lose none of them).

Phase i's arrivals come from random.Random(seed * 1000 + i), so each phase's schedule is the same
for the same seed whatever the other phases' rates or lengths.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

PHASES = ("warm", "step", "cool")
# Past this many requests in one run a flag is wrong, not a benchmark (a run is minutes long).
MAX_REQUESTS = 50_000


class PlanError(ValueError):
    """Rates or durations that make no run; the message names the flag."""


@dataclass(frozen=True)
class Phase:
    name: str
    start_s: float
    duration_s: float
    rate: float        # requests per second
    seed: int

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    def arrival_times(self) -> list[float]:
        """Poisson arrivals in [start_s, end_s), seconds from the run's start."""
        rng = random.Random(self.seed)
        out: list[float] = []
        t = self.start_s + rng.expovariate(self.rate)
        while t < self.end_s:
            out.append(t)
            t += rng.expovariate(self.rate)
        return out


@dataclass(frozen=True)
class Arrival:
    at_s: float        # when it is sent, from the run's start
    phase: str


def plan_phases(base_rate: float, step_factor: float, warm_s: float, step_s: float, cool_s: float,
                seed: int = 0) -> list[Phase]:
    """warm, step, cool in the order they run; PlanError for a plan that makes no run."""
    if not base_rate > 0:
        raise PlanError(f"the base rate must be > 0 (got {base_rate:g} req/s): check --base-rate or --base-load")
    if not step_factor > 1:
        raise PlanError("--step-factor must be > 1")
    if not (warm_s > 0 and step_s > 0 and cool_s > 0):
        raise PlanError("--warm, --step and --cool must be > 0")
    phases, start = [], 0.0
    for i, (name, duration, rate) in enumerate(zip(PHASES, (warm_s, step_s, cool_s),
                                                   (base_rate, base_rate * step_factor, base_rate))):
        phases.append(Phase(name, start, duration, rate, seed * 1000 + i))
        start += duration
    n = sum(len(p.arrival_times()) for p in phases)
    if n > MAX_REQUESTS:
        raise PlanError(f"the run would send {n} requests (at most {MAX_REQUESTS}): lower the rate or the durations")
    return phases


def schedule(phases: list[Phase]) -> list[Arrival]:
    """Every phase's arrivals, in time order."""
    return [Arrival(t, p.name) for p in phases for t in p.arrival_times()]


def phase_at(phases: list[Phase], t_s: float) -> str | None:
    """The phase whose [start, end) holds t_s; None outside the run."""
    return next((p.name for p in phases if p.start_s <= t_s < p.end_s), None)
