"""The node pool's size over the run, as the /health samples saw it (health.py), per role.

    changes             every sample whose counts (live, draining, starting per role) differ from the
                        sample before, the first one included: the pool's history in a few rows
    at_step_start       live nodes in the last sample before the step (else the first sample)
    first_up_s          from the step's start to the first sample with more live nodes than that
    peak_live, peak_s   the most live nodes seen from the step's start, and when first seen
                        (seconds from the step's start)
    first_drain_s       from the cool-down's start to the first sample with a node draining
    back_to_min_s       from the cool-down's start to the first sample with `least` live nodes and
                        none draining or starting: the scale-down done
    live_at_end         live nodes in the last sample
None where the samples never showed it. `least` is the role's minimum (main.py's --nodes), else the
count at the step's start. `at_min` is the same test on one sample (the wait before the load step).
"""
from __future__ import annotations

from collections.abc import Callable

from raypd.benchmarks.autoscale.health import HealthSample
from raypd.benchmarks.autoscale.plan import Phase


def counts(sample: HealthSample, role: str) -> dict[str, int]:
    return {"live": sample.count(role, "live"), "draining": sample.count(role, "draining"),
            "starting": sample.starting(role)}


def roles_seen(samples: list[HealthSample]) -> list[str]:
    return sorted({role for s in samples for role in s.roles})


def changes(samples: list[HealthSample]) -> list[dict]:
    roles, out, last = roles_seen(samples), [], None
    for s in samples:
        now = {role: counts(s, role) for role in roles}
        if now != last:
            out.append({"t_s": round(s.t_s, 3), "roles": now})
            last = now
    return out


def at_min(sample: HealthSample, least: dict[str, int]) -> bool:
    """Every role at its minimum: `least` live, none draining or starting."""
    return all(counts(sample, role) == {"live": n, "draining": 0, "starting": 0} for role, n in least.items())


def _first(samples: list[HealthSample], since: float, test: Callable[[HealthSample], bool]) -> float | None:
    return next((s.t_s - since for s in samples if s.t_s >= since and test(s)), None)


def scaling(samples: list[HealthSample], step: Phase, cool: Phase, least: dict[str, int]) -> dict[str, dict]:
    return {role: _role_scaling(samples, role, step, cool, least.get(role)) for role in roles_seen(samples)}


def _role_scaling(samples: list[HealthSample], role: str, step: Phase, cool: Phase, least: int | None) -> dict:
    before = [s for s in samples if s.t_s < step.start_s] or samples[:1]
    start = before[-1].count(role, "live") if before else 0
    floor = start if least is None else least
    peak = max((s.count(role, "live") for s in samples if s.t_s >= step.start_s), default=None)
    return {"least": floor, "at_step_start": start,
            "first_up_s": _first(samples, step.start_s, lambda s: s.count(role, "live") > start),
            "peak_live": peak,
            "peak_s": None if peak is None else _first(samples, step.start_s, lambda s: s.count(role, "live") == peak),
            "first_drain_s": _first(samples, cool.start_s, lambda s: s.count(role, "draining") > 0),
            "back_to_min_s": _first(samples, cool.start_s,
                                    lambda s: counts(s, role) == {"live": floor, "draining": 0, "starting": 0}),
            "live_at_end": samples[-1].count(role, "live") if samples else None}
