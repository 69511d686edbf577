"""The run in time buckets, and the recovery time read from them.

Buckets: each phase is cut from its own start into buckets of `width_s` (its last one shorter when
the width does not divide it), so a phase boundary is always a bucket boundary. A request belongs to
the bucket that holds its arrival (its scheduled send time). Per bucket: requests, met, attainment =
met / requests (None without requests), the offered rate = requests / the bucket's length, and per
role the most nodes live, draining and starting (the autoscale key's count; 0 without it) in the
/health samples read inside the bucket.

Recovery: the time from the step's start to the start of the first bucket of the step from which
every bucket of the step with requests has attainment >= the target (the SLO's attainment, 0.9 by
default). 0 when no bucket of the step fell below it; None (never recovered) when the step's last
bucket with requests is below it. The cool-down is judged apart (its own attainment and its buckets
below the target), so a dip while the pool shrinks is not mistaken for a slow recovery.
"""
from __future__ import annotations

from dataclasses import dataclass

from raypd.benchmarks.autoscale.health import HealthSample
from raypd.benchmarks.autoscale.plan import Phase
from raypd.benchmarks.autoscale.records import Record
from raypd.benchmarks.serve.metrics import SLO

NODE_STATES = ("live", "draining", "starting")


@dataclass(frozen=True)
class Bucket:
    phase: str
    start_s: float
    end_s: float
    requests: int = 0
    met: int = 0
    nodes: dict[str, dict[str, int]] | None = None   # role -> state (NODE_STATES) -> the most seen

    @property
    def attainment(self) -> float | None:
        return self.met / self.requests if self.requests else None

    @property
    def offered_rps(self) -> float:
        return self.requests / (self.end_s - self.start_s)

    def as_json(self) -> dict:
        return {"phase": self.phase, "start_s": round(self.start_s, 3), "end_s": round(self.end_s, 3),
                "requests": self.requests, "met": self.met, "attainment": self.attainment,
                "offered_rps": self.offered_rps, "nodes": self.nodes or {}}


def bucket_edges(phases: list[Phase], width_s: float) -> list[tuple[str, float, float]]:
    """(phase, start, end) of every bucket, in time order."""
    if not width_s > 0:
        raise ValueError("the bucket width must be > 0")
    out = []
    for p in phases:
        i = 0
        while (start := p.start_s + i * width_s) < p.end_s - 1e-9:
            out.append((p.name, start, min(start + width_s, p.end_s)))
            i += 1
    return out


def node_counts(samples: list[HealthSample]) -> dict[str, dict[str, int]]:
    """Per role, the most nodes live, draining and starting over the samples given."""
    roles = sorted({role for s in samples for role in s.roles} | {role for s in samples for role in _scaled(s)})
    return {role: {"live": max(s.count(role, "live") for s in samples),
                   "draining": max(s.count(role, "draining") for s in samples),
                   "starting": max(s.starting(role) for s in samples)} for role in roles}


def _scaled(sample: HealthSample) -> list[str]:
    roles = (sample.autoscale or {}).get("roles")
    return list(roles) if isinstance(roles, dict) else []


def buckets(records: list[Record], phases: list[Phase], samples: list[HealthSample], slo: SLO,
            width_s: float) -> list[Bucket]:
    out = []
    for phase, start, end in bucket_edges(phases, width_s):
        inside = [r for r in records if start <= r.at_s < end]
        read = [s for s in samples if start <= s.t_s < end]
        out.append(Bucket(phase, start, end, len(inside), sum(1 for r in inside if r.meets(slo)),
                          node_counts(read) if read else None))
    return out


def rated(timeline: list[Bucket], phase: str) -> list[tuple[Bucket, float]]:
    """The phase's buckets that have requests, each with its attainment."""
    return [(b, a) for b in timeline if b.phase == phase and (a := b.attainment) is not None]


def recovery(timeline: list[Bucket], step: Phase, target: float) -> dict:
    """The recovery rule (module docstring) on the step's buckets."""
    step_buckets = rated(timeline, step.name)
    below = [i for i, (_, a) in enumerate(step_buckets) if a < target]
    out: dict = {"target_attainment": target, "step_start_s": step.start_s, "rated_buckets": len(step_buckets),
                 "dipped": bool(below), "buckets_below_target": len(below), "recovered_at_s": None, "recovery_s": None,
                 "never_recovered": False}
    if not step_buckets:
        return out
    if not below:
        return out | {"recovered_at_s": step.start_s, "recovery_s": 0.0}
    if below[-1] == len(step_buckets) - 1:
        return out | {"never_recovered": True}
    at = step_buckets[below[-1] + 1][0].start_s
    return out | {"recovered_at_s": at, "recovery_s": at - step.start_s}


def cool_down(timeline: list[Bucket], target: float) -> dict:
    """The cool-down's buckets: how many, how many below the target, the lowest attainment."""
    cool = [a for _, a in rated(timeline, "cool")]
    return {"buckets": len(cool), "buckets_below_target": sum(1 for a in cool if a < target),
            "lowest_attainment": min(cool, default=None)}
