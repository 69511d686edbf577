"""NodeMetrics without Ray: gauges from a LoadReport, counters from the growth of stats() totals."""
from __future__ import annotations

from raypd.node.node_metrics import NodeMetrics
from raypd.protocol.messages import LoadReport
from tests.fake_metrics import FakeMetricsAPI


def report(name: str = "raypd-prefill-0", role: str = "prefill", **fields) -> LoadReport:
    base = dict(queued_prefill_tokens=300, waiting=2, running=3, free_blocks=50, total_blocks=64, cached_blocks=9,
                inflight=1, step_time_s=0.04, prefill_tokens_per_s=900.0)
    return LoadReport(node_name=name, role=role, **{**base, **fields})


def prefill_stats(completed: int, failed: int, exported: int = 0, rooms: int = 0) -> dict:
    """The parts of a PrefillNode's stats() NodeMetrics reads."""
    return {"completed": completed, "failed": failed, "transfer": {"rooms": rooms + 1, "live_rooms": rooms},
            "prefix_copies": {"exported": exported, "imported": 0, "failed": 0}}


def test_gauges_follow_the_latest_report_per_node():
    api = FakeMetricsAPI()
    m = NodeMetrics(api)
    m.observe(report())
    m.observe(report(running=7, free_blocks=40))
    m.observe(report("raypd-decode-0", "decode", running=11))
    prefill = {"node": "raypd-prefill-0", "role": "prefill"}
    assert api["raypd_node_running"].value(**prefill) == 7
    assert api["raypd_node_free_blocks"].value(**prefill) == 40
    assert api["raypd_node_queued_prefill_tokens"].value(**prefill) == 300
    assert api["raypd_node_step_time_seconds"].value(**prefill) == 0.04
    assert api["raypd_node_running"].value(node="raypd-decode-0", role="decode") == 11
    assert api["raypd_node_total_blocks"].value() == 128  # one series per node


def test_counters_add_what_the_totals_grew_by():
    api = FakeMetricsAPI()
    m = NodeMetrics(api)
    m.observe(report(), prefill_stats(completed=3, failed=1, exported=2, rooms=4))
    m.observe(report(), prefill_stats(completed=3, failed=1, exported=2, rooms=0))  # nothing new
    m.observe(report(), prefill_stats(completed=8, failed=1, exported=3, rooms=1))
    assert api["raypd_node_prefill_completions"].value(node="raypd-prefill-0") == 8
    assert api["raypd_node_prefill_failures"].value(node="raypd-prefill-0") == 1
    assert api["raypd_node_prefix_copies"].value(direction="export") == 3
    assert api["raypd_node_prefix_copies"].value(direction="import") == 0
    assert api["raypd_node_transfer_rooms"].value(node="raypd-prefill-0") == 1


def test_kv_tier_totals_become_counters_by_tier_and_operation():
    api = FakeMetricsAPI()
    m = NodeMetrics(api)
    tier = {"kv_tier_disk_stored": 5, "kv_tier_disk_loaded": 2, "kv_tier_disk_rejected": 1, "kv_tier_disk_evicted": 0,
            "kv_tier_disk_bytes_written": 5000, "kv_tier_disk_bytes_read": 2000, "kv_tier_disk_load_seconds": 0.5,
            "kv_tier_host_stored": 7, "kv_tier_host_loaded": 3, "kv_tier_lookup_blocks": 10}
    m.observe(report("raypd-decode-0", "decode"), tier)
    m.observe(report("raypd-decode-0", "decode"), {**tier, "kv_tier_disk_loaded": 6, "kv_tier_disk_bytes_read": 6000,
                                                   "kv_tier_disk_load_seconds": 1.5, "kv_tier_lookup_blocks": 30})
    assert api["raypd_node_kv_tier_blocks"].value(tier="disk", op="stored") == 5
    assert api["raypd_node_kv_tier_blocks"].value(tier="disk", op="loaded") == 6
    assert api["raypd_node_kv_tier_blocks"].value(tier="disk", op="rejected") == 1
    assert api["raypd_node_kv_tier_blocks"].value(tier="host", op="stored") == 7
    assert api["raypd_node_kv_tier_blocks"].value(tier="host", op="loaded") == 3
    assert api["raypd_node_kv_tier_bytes"].value(tier="disk", direction="read") == 6000
    assert api["raypd_node_kv_tier_load_seconds"].value(tier="disk") == 1.5
    assert api["raypd_node_kv_tier_lookup_blocks"].value(node="raypd-decode-0") == 30


def test_retractions_and_preemptions_count_apart():
    api = FakeMetricsAPI()
    m = NodeMetrics(api)
    m.observe(report("raypd-mixed-0", "mixed"), {"num_retractions": 2, "num_preemptions": 0})
    m.observe(report("raypd-mixed-0", "mixed"), {"num_retractions": 3, "num_preemptions": 4})
    assert api["raypd_node_requeued"].value(cause="retraction") == 3
    assert api["raypd_node_requeued"].value(cause="preemption") == 4


def test_decode_stats_without_prefill_totals_count_nothing():
    api = FakeMetricsAPI()
    m = NodeMetrics(api)
    m.observe(report("raypd-decode-0", "decode"), {"queues": {}, "transfer": {"rooms": 2, "live_rooms": 2}})
    assert api["raypd_node_prefill_completions"].values == {}
    assert api["raypd_node_transfer_rooms"].value(node="raypd-decode-0", role="decode") == 2


def test_report_only_leaves_the_counters_alone():
    api = FakeMetricsAPI()
    NodeMetrics(api).observe(report())
    assert api["raypd_node_prefill_completions"].values == {}
    assert api["raypd_node_transfer_rooms"].values == {}


def test_without_ray_observe_is_a_no_op():
    m = NodeMetrics()
    assert not m.enabled  # ray is not initialized in unit tests
    m.observe(report(), prefill_stats(1, 0))


def test_the_real_ray_metric_classes_accept_the_declarations():
    from ray.util import metrics

    assert NodeMetrics(metrics).enabled
