"""ConductorMetrics through a fake metrics API: what ConductorCore records per decision, delivery,
load report, rejection and tick, under the metric names and tags the dashboard queries."""
from __future__ import annotations

import pytest

from raypd.conductor.config import ConductorConfig
from raypd.conductor.core import ConductorCore
from raypd.conductor.errors import AdmissionRejected
from raypd.conductor.metrics import ConductorMetrics
from tests.conductor.helpers import EventMaker, FakeClock, batch, host, load
from tests.fake_metrics import FakeMetricsAPI

BS = 16
PROMPT = list(range(300, 400))
PREFIX = PROMPT[:64]
P = "raypd_conductor_"


def make(api: FakeMetricsAPI, **config) -> ConductorCore:
    core = ConductorCore(ConductorConfig(block_size=BS, **config), clock=FakeClock(),
                         metrics=ConductorMetrics(api))
    for name, role in [("p0", "prefill"), ("p1", "prefill"), ("d0", "decode")]:
        core.register_node(name, role, host())
    return core


def test_decisions_count_by_policy_and_branch_with_the_predicted_cache():
    api = FakeMetricsAPI()
    core = make(api)
    core.report_kv_events(batch("p0", EventMaker(BS).stored(PREFIX)))
    assert core.route("r1", PROMPT).branch == "local"
    core.route("r2", list(range(5000, 5100)))
    assert api[P + "decisions_total"].value(policy="cost", branch="local") == 1
    assert api[P + "decisions_total"].value(policy="cost", branch="cold") == 1
    assert api[P + "predicted_cached_tokens_total"].value() == 64
    assert len(api[P + "decision_latency_ms"].observed()) == 2
    assert api[P + "kv_events_total"].value() == 1


def test_delivery_records_the_prediction_error_and_its_direction():
    api = FakeMetricsAPI()
    core = make(api)
    core.report_kv_events(batch("p0", EventMaker(BS).stored(PREFIX)))
    assert core.route("r1", PROMPT).predicted_cached_tokens == 64
    assert core.route("r2", list(range(5000, 5100))).predicted_cached_tokens == 0
    core.report_delivered("r1", 48)
    core.report_delivered("r2", 16)
    assert api[P + "delivered_cached_tokens_total"].value() == 64
    assert api[P + "cached_tokens_abs_error"].observed() == [16, 16]
    assert api[P + "cached_tokens_mispredicted_total"].value(direction="over") == 1
    assert api[P + "cached_tokens_mispredicted_total"].value(direction="under") == 1


def test_load_reports_set_per_node_gauges_tagged_with_the_plain_role():
    api = FakeMetricsAPI()
    core = make(api)
    core.report_load(load("p0", queued=300, running=2, free_blocks=40))
    core.report_load(load("d0", "decode", running=7))
    assert api[P + "node_queued_prefill_tokens"].value(node="p0", role="prefill") == 300
    assert api[P + "node_free_blocks"].value(node="p0", role="prefill") == 40
    assert api[P + "node_running"].value(node="d0", role="decode") == 7
    (tags,) = [dict(k) for k in api[P + "node_running"].values if dict(k)["node"] == "d0"]
    assert type(tags["role"]) is str  # the exported label, not the enum member


def test_slo_rejections_count_by_reason():
    api = FakeMetricsAPI()
    core = make(api, ttft_slo_s=1e-9)
    with pytest.raises(AdmissionRejected):
        core.route("r1", PROMPT)
    assert api[P + "rejections_total"].value(reason="ttft") == 1
    assert api[P + "decisions_total"].values == {}


def test_tick_sets_the_index_gauges_and_resync_counts_per_node():
    api = FakeMetricsAPI()
    core = make(api)
    core.report_kv_events(batch("p0", EventMaker(BS).stored(PREFIX)))
    core.tick()
    assert api[P + "index_blocks"].value() == 4
    assert api[P + "index_entries"].value() == 4
    core.resync("p0", 1, [EventMaker(BS).stored(PREFIX)])
    assert api[P + "resyncs_total"].value(node="p0") == 1


def test_without_ray_nothing_is_recorded():
    m = ConductorMetrics()
    assert not m.enabled  # ray is not initialized in unit tests
    m.decision("cost", "local", 0.001, 10)
    m.node_load("p0", "prefill", 1, 2, 3)
    m.migration("started", 10)
    m.resync("p0")


def test_the_real_ray_metric_classes_accept_the_declarations():
    from ray.util import metrics

    assert ConductorMetrics(metrics).enabled
