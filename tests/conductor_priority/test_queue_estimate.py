"""The Conductor's queue estimate by priority, on hand-built states (the real core, load reports
written by the test, no Ray): a request waits behind the queued work at its priority or a more
urgent one, so an urgent request at a node flooded with batch work gets a short estimate and passes
the SLO admission while a batch request there is rejected; equal priorities route exactly as before
(reports without a summary, calls without a priority); the split-or-local choice weighs the same
queue; the summary's bound only ever overstates a queue."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from raypd.conductor.config import ConductorConfig, LocalPrefillConfig
from raypd.conductor.core import ConductorCore
from raypd.conductor.errors import AdmissionRejected
from raypd.protocol.errors import InvalidRequestError
from raypd.protocol.messages import LoadReport
from raypd.protocol.queued_by_priority import MAX_LEVELS, MOST_URGENT, placed, summarize, tokens_behind
from raypd.protocol.sampling_params import PRIORITY_BOUND
from tests.conductor.helpers import FakeClock, host, load

BS = 16
SPEED = 1000.0                      # prefill tokens/s of every prefill node
PROMPT = list(range(1000, 1256))    # 256 tokens, ~0.27 s of prefill
CHAT = list(range(3000, 3064))      # 64 tokens
URGENT, DEFAULT, BATCH = -1, 0, 5


def by_priority(report: LoadReport, *levels: tuple[int, int]) -> LoadReport:
    return replace(report, queued_prefill_by_priority=tuple(levels))


def make(nodes: dict[str, LoadReport], **config) -> ConductorCore:
    core = ConductorCore(ConductorConfig(block_size=BS, **config), clock=FakeClock())
    for name, report in nodes.items():
        core.register_node(name, report.role, host())
        core.report_load(report)
    return core


def ahead(core: ConductorCore, node: str, priority: int) -> float:
    return float(core.table.prefill_queue_ahead(np.array([core.registry.get(node).slot]), priority)[0])


def test_an_urgent_request_passes_a_batch_flood_and_is_admitted_where_a_batch_one_is_rejected():
    flooded = by_priority(load("p0", queued=40_000, speed=SPEED), (BATCH, 40_000))   # 40 s of batch prompts
    core = make({"p0": flooded, "d0": load("d0", "decode", speed=0.0)}, ttft_slo_s=2.0)
    d = core.route("urgent", PROMPT, priority=URGENT)
    assert d.prefill_node == "p0" and not d.rejected and d.priority == URGENT
    assert d.est_ttft_s < 0.5                                     # its own prefill and the KV send only
    c = d.candidates[0]
    assert (c.queued_tokens, c.queue_s, c.queued_behind_tokens) == (0.0, 0.0, 40_000.0)
    assert "priority -1" in d.explain() and "(0 tokens ahead, 40000 less urgent passed)" in d.explain()
    with pytest.raises(AdmissionRejected) as rejected:
        core.route("batch", CHAT, priority=BATCH)
    # The batch request waits behind the flood and the urgent request routed since the report.
    b = rejected.value.decision
    assert rejected.value.estimate_s > 40.0 and b.priority == BATCH
    assert (b.candidates[0].queued_tokens, b.candidates[0].queued_behind_tokens) == (40_000 + 256, 0.0)
    assert core.status()["rejected"] == 1 and core.status()["decisions"] == 1


def test_the_queue_is_the_work_at_the_request_priority_or_more_urgent_reported_and_routed_since():
    levels = ((MOST_URGENT, 512), (URGENT, 1000), (DEFAULT, 2000), (BATCH, 40_000))  # 512: chunks under way
    report = by_priority(load("p0", queued=43_512, speed=SPEED, timestamp=900.0), *levels)
    core = make({"p0": report, "d0": load("d0", "decode", speed=0.0)})
    expected = {-PRIORITY_BOUND: 512, -5: 512, URGENT: 1512, DEFAULT: 3512, 3: 3512, BATCH: 43_512,
                PRIORITY_BOUND: 43_512}
    assert {p: ahead(core, "p0", p) for p in expected} == expected
    assert {p: report.queued_prefill_ahead_of(p) for p in expected} == expected   # the report's own reading
    # Routed since the report: counted by the priority it was routed at.
    core.table.add_pending_prefill(core.registry.get("p0").slot, 300, now=1000.0, priority=2)
    assert (ahead(core, "p0", DEFAULT), ahead(core, "p0", 2), ahead(core, "p0", BATCH)) == (3512, 3812, 43_812)
    # A report stamped after it covers it: the routed-since part is gone, the new levels stand.
    core.report_load(by_priority(replace(report, queued_prefill_tokens=100, timestamp=1001.0), (BATCH, 100)))
    assert (ahead(core, "p0", DEFAULT), ahead(core, "p0", BATCH)) == (0, 100)


def test_each_priority_is_routed_by_the_queue_it_sees():
    core = make({"p0": by_priority(load("p0", queued=40_000, speed=SPEED), (BATCH, 40_000)),
                 "p1": by_priority(load("p1", queued=3000, speed=SPEED), (DEFAULT, 3000)),
                 "d0": load("d0", "decode", speed=0.0)})
    assert core.route("urgent", PROMPT, priority=DEFAULT).prefill_node == "p0"   # passes the flood
    assert core.route("batch", CHAT, priority=BATCH).prefill_node == "p1"        # would wait behind it


def test_a_report_without_a_summary_counts_all_its_queue_ahead_of_every_request():
    core = make({"p0": load("p0", queued=5000, speed=SPEED), "d0": load("d0", "decode", speed=0.0)})
    assert ahead(core, "p0", -PRIORITY_BOUND) == ahead(core, "p0", PRIORITY_BOUND) == 5000
    # A summary that places only part of the total: the rest is ahead of everyone.
    core.report_load(by_priority(load("p0", queued=5000, speed=SPEED), (BATCH, 3000)))
    assert (ahead(core, "p0", URGENT), ahead(core, "p0", BATCH)) == (2000, 5000)


def _fleet(levels_of) -> dict[str, LoadReport]:
    """Three prefill nodes with different queues and speeds, two decode nodes, one local-prefilling;
    `levels_of(total)`: the summary each report carries."""
    reports = [load("p0", queued=1000, speed=800.0), load("p1", queued=5000, speed=3000.0),
               load("p2", queued=200, speed=500.0),
               load("d0", "decode", queued=300, speed=0.0, running=6, step_time_s=0.03),
               load("d1", "decode", speed=0.0, running=2, step_time_s=0.02)]
    return {r.node_name: replace(r, queued_prefill_by_priority=levels_of(r.queued_prefill_tokens)) for r in reports}


@pytest.mark.parametrize("policy", ["cost", "least_loaded", "cache_aware"])
def test_equal_priorities_route_exactly_as_before(policy):
    """Reports without a summary and calls without a priority (before priorities), against the same
    queues reported at the request's priority (part of it as chunks under way, ahead of everyone)."""
    cfg = dict(policy=policy, local_prefill=LocalPrefillConfig(enabled=True, step_budget_tokens=32))
    before = make(_fleet(lambda total: ()), **cfg)
    at_default = make(_fleet(lambda total: summarize([(MOST_URGENT, total // 4), (DEFAULT, total - total // 4)])), **cfg)
    at_batch = make(_fleet(lambda total: ((BATCH, total),)), **cfg)
    prompts = [PROMPT, CHAT, PROMPT[:128] + CHAT, list(range(7000, 7600)), CHAT, PROMPT]
    for k, prompt in enumerate(prompts):
        if k == 3:   # a report between decisions, stamped after the first ones
            for core in (before, at_default, at_batch):
                core.clock.advance(1.0)
                report = _fleet(lambda total: ())["p1"]
                core.report_load(replace(report, timestamp=core.clock(),
                                         queued_prefill_by_priority=() if core is before else
                                         ((DEFAULT if core is at_default else BATCH, report.queued_prefill_tokens),)))
        decisions = [before.route(f"r{k}", prompt), at_default.route(f"r{k}", prompt),
                     at_batch.route(f"r{k}", prompt, priority=BATCH)]
        assert {d.priority for d in decisions[:2]} == {DEFAULT} and decisions[2].priority == BATCH
        same = [{**d.to_dict(), "latency_s": 0.0, "priority": 0} for d in decisions]
        assert same[0] == same[1] == same[2], [d.explain() for d in decisions]
        assert "less urgent passed" not in decisions[0].explain()


def test_split_or_local_weighs_the_queue_the_request_sees():
    """A long batch queue at the prefill node sends a batch chat prompt to the busy decode node's own
    prefill (as any prompt before priorities); an urgent one passes that queue, so the split path
    is faster once the decode node's stall is counted, and its local estimate passes the decode
    node's own batch prompts too."""
    cfg = dict(local_prefill=LocalPrefillConfig(enabled=True, step_budget_tokens=32))
    nodes = {"p0": by_priority(load("p0", queued=8192, speed=SPEED), (BATCH, 8192)),
             "d0": by_priority(load("d0", "decode", queued=256, speed=0.0, running=4, step_time_s=0.03), (BATCH, 256))}
    batch = make(nodes, **cfg).route("batch", CHAT, priority=BATCH)
    assert batch.path == "local" and batch.local.queued_tokens == 256 and batch.local.split_ttft_s > 8.0
    urgent = make(nodes, **cfg).route("urgent", CHAT, priority=DEFAULT)
    assert urgent.path == "split" and urgent.prefill_node == "p0" and "stall" in urgent.local.why
    assert (urgent.local.queued_tokens, urgent.local.queued_behind_tokens) == (0.0, 256.0)
    assert "L d0: cached 0 queued 0 (0 tokens ahead, 256 less urgent passed)" in urgent.explain()


@pytest.mark.parametrize("priority", [PRIORITY_BOUND + 1, -PRIORITY_BOUND - 1, True, 1.5, "0"])
def test_a_priority_that_is_not_one_is_an_invalid_request(priority):
    core = make({"p0": load("p0", speed=SPEED), "d0": load("d0", "decode", speed=0.0)})
    with pytest.raises(InvalidRequestError) as e:
        core.route("r", CHAT, priority=priority)
    assert e.value.param == "priority" and core.status()["decisions"] == 0


def test_the_summary_folds_the_least_urgent_levels_into_the_last_kept_and_only_overstates():
    assert summarize([(3, 10), (1, 5), (3, 2), (9, 0)]) == ((1, 5), (3, 12))
    levels = [(p, 100) for p in range(MAX_LEVELS + 2)]                   # 10 levels, 100 tokens each
    folded = summarize(levels)
    assert len(folded) == MAX_LEVELS and folded[-1] == (MAX_LEVELS - 1, 300)
    assert sum(t for _, t in folded) == 1000
    assert placed(folded, 1200)[0] == (MOST_URGENT, 200) and placed(folded, 1000) == folded
    # A node that sent more levels than a row holds: the Conductor folds them the same way.
    core = make({"p0": by_priority(load("p0", queued=1000, speed=SPEED), *levels),
                 "d0": load("d0", "decode", speed=0.0)})
    for p in range(MAX_LEVELS + 2):
        exact = 1000 - tokens_behind(tuple(levels), p)
        assert ahead(core, "p0", p) == (exact if p < MAX_LEVELS - 1 else 1000) >= exact
