"""A hand-built load step for the report's and the plot's tests: warm 20 s, step 40 s, cool 60 s;
one request a second (three in the step), 10 s buckets; the pool grows from 1 to 3 mixed nodes in
the step and drains back to 1 in the cool-down. `missed` lists the seconds whose requests miss the
SLO, `lost` the seconds whose requests get a 503."""
from __future__ import annotations

from collections.abc import Collection

from raypd.benchmarks.autoscale.health import HealthSample
from raypd.benchmarks.autoscale.plan import Phase, plan_phases
from raypd.benchmarks.autoscale.records import Record
from raypd.benchmarks.autoscale.report import build_report
from raypd.benchmarks.autoscale.run import Measured
from raypd.benchmarks.serve.metrics import SLO

SLO_ = SLO(ttft_s=1.0, tpot_s=0.1, attainment=0.9)
CONFIG = {"command": "raypd bench autoscale", "settings": {"base_load": 0.4}, "slo": {"ttft_s": 1.0, "tpot_s": 0.1,
          "attainment": 0.9}, "pool": {"role": "mixed", "nodes": "1:3", "autoscale": True}}


def plan() -> list[Phase]:
    return plan_phases(1.0, 3.0, warm_s=20.0, step_s=40.0, cool_s=60.0)


def live_at(t: float) -> tuple[int, int]:
    """(live, draining) mixed nodes at t."""
    if t < 30:
        return 1, 0
    if t < 45:
        return 2, 0
    if t < 75:
        return 3, 0
    if t < 80:
        return 2, 1
    if t < 95:
        return 2, 0
    if t < 100:
        return 1, 1
    return 1, 0


def measured(missed: Collection[int], lost: Collection[int] = ()) -> Measured:
    records = []
    for p in plan():
        per_s = 3 if p.name == "step" else 1
        for t in range(int(p.start_s), int(p.end_s)):
            for k in range(per_s):
                at = t + k / per_s
                if t in lost:
                    records.append(Record(at, p.name, "503", "http_503", None, None, at, at + 0.01))
                else:
                    ttft = 5.0 if t in missed else 0.3
                    records.append(Record(at, p.name, "200", None, ttft, 0.05, at, at + ttft + 1.5))
    samples = []
    for t in range(0, 121):
        live, draining = live_at(t)
        roles = {"mixed": {"live": live, **({"draining": draining} if draining else {})}}
        samples.append(HealthSample(float(t), 200, "ok", roles, {"roles": {"mixed": {"starting": int(25 <= t < 30)}}}))
    return Measured(records, samples, [{"role": "mixed", "delta": 1, "reason": "ttft", "at": 5.0}], 0, 0, 0, 0,
                    121.0, {"at_min": True, "waited_s": 0.1, "pool": {"mixed": {"live": 1}}})


def report(missed: Collection[int], lost: Collection[int] = (), recover_within_s: float = 30.0) -> dict:
    return build_report(CONFIG, None, 1.0, plan(), measured(missed, lost), SLO_, {"mixed": 1}, 10.0, recover_within_s,
                        [{"label": "autoscale", "command": "raypd serve", "log": "x", "processes_left_after": []}],
                        [])
