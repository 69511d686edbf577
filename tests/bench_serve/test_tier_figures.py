"""The KV tiers' figures of a run: totals summed over the nodes' stats(), the difference between
two readings, the printed lines, and a reading that fails."""
from __future__ import annotations

import pytest

from raypd.benchmarks.serve.tier.figures import figures, format_lines, totals
from raypd.benchmarks.serve.tier.node_stats import TierReader, read


def _node(disk_loaded: float, lookups: float, host_loaded: float | None = None, **more: float) -> dict:
    """A node's stats() as the engine reports its tiers (only the tiers it has), among other keys."""
    stats: dict = {"name": "raypd-prefill-0", "role": "prefill", "num_blocks": 64, "kv_tier_lookup_blocks": lookups,
                   "kv_tier_disk_stored": 100, "kv_tier_disk_loaded": disk_loaded, "kv_tier_disk_rejected": 1,
                   "kv_tier_disk_evicted": 8, "kv_tier_disk_bytes_written": 100e6,
                   "kv_tier_disk_bytes_read": disk_loaded * 1e6, "kv_tier_disk_load_seconds": disk_loaded / 100,
                   "kv_tier_disk_blocks": 92,  # what the tier holds now: not a running total
                   "kv_tier_stored": 999, **more}  # the older, tier-less name: not read
    if host_loaded is not None:
        stats |= {"kv_tier_host_loaded": host_loaded, "kv_tier_host_stored": 0, "kv_tier_host_load_seconds": 0.0}
    return stats


def test_totals_sum_the_nodes_by_tier():
    t = totals([_node(30, 60, host_loaded=4), _node(10, 20), {"name": "raypd-decode-0", "num_blocks": 64}])
    assert t == pytest.approx({"disk_stored": 200, "disk_loaded": 40, "disk_rejected": 2, "disk_evicted": 16,
                               "disk_bytes_written": 200e6, "disk_bytes_read": 40e6, "disk_load_seconds": 0.4,
                               "host_loaded": 4, "host_stored": 0, "host_load_seconds": 0.0, "lookup_blocks": 80})


def test_figures_are_what_the_run_added():
    before = totals([_node(10, 20, host_loaded=0)])
    after = totals([_node(40, 80, host_loaded=6, kv_tier_disk_stored=130, kv_tier_disk_bytes_written=130e6)])
    f = figures(before, after)
    assert f is not None and f["lookup_blocks"] == 60 and f["hit_rate"] == pytest.approx(36 / 60)
    assert f["disk"] == pytest.approx({"hit_rate": 0.5, "stored_blocks": 30, "loaded_blocks": 30, "rejected_blocks": 0,
                                       "evicted_blocks": 0, "bytes_written": 30_000_000, "bytes_read": 30_000_000,
                                       "load_s": 0.3})
    assert f["host"]["loaded_blocks"] == 6 and f["host"]["hit_rate"] == pytest.approx(0.1)
    host_line, disk_line = format_lines(f)
    assert host_line.startswith("KV tier host: hit rate 10% of 60 blocks past the pool; loaded 6 blocks")
    assert disk_line == ("KV tier disk: hit rate 50% of 60 blocks past the pool; loaded 30 blocks (30.0 MB) in 0.30 s "
                         "(10.00 ms/block); stored 30 (30.0 MB); evicted 0, rejected 0")


def test_a_system_without_a_tier_has_no_figures():
    plain = [{"name": "raypd-prefill-0", "num_blocks": 64, "num_evicted_blocks": 12}]
    assert figures(totals(plain), totals(plain)) is None
    f = figures({}, totals([{"kv_tier_disk_stored": 3}]))  # a tier with no lookups yet
    assert f is not None and f["hit_rate"] is None and f["disk"]["hit_rate"] is None and f["disk"]["stored_blocks"] == 3
    assert "hit rate - of 0 blocks" in format_lines(f)[0] and "(-)" in format_lines(f)[0]


def test_reader_diffs_its_two_readings_and_gives_none_without_one():
    readings = iter([[_node(10, 20)], [_node(25, 40)]])
    reader = TierReader("addr", read=lambda _: next(readings))
    reader.before()
    f = reader.after()
    assert f is not None and f["disk"]["loaded_blocks"] == 15 and f["hit_rate"] == pytest.approx(0.75)
    failing = iter([None, [_node(1, 2)]])
    reader = TierReader("addr", read=lambda _: next(failing))
    reader.before()
    unread = reader.after()
    assert unread is not None and "could not be read" in unread["error"]
    assert format_lines(unread) == [f"KV tier: {unread['error']}"] and format_lines(None) == ["KV tier: none"]


def test_a_cluster_that_does_not_answer_gives_no_reading(capsys):
    assert read("127.0.0.1:1", timeout_s=60) is None  # the subprocess gives up at its probe of the GCS port
    err = capsys.readouterr().err
    assert "no KV tier figures" in err and "no Ray cluster answers at" in err  # Ray names the port by the node IP


def test_routing_summary_counts_branches_and_explains_the_latest_tier_decision():
    from raypd.benchmarks.serve.tier.node_stats import routing_summary
    from raypd.conductor.decision import RouteDecision

    def decision(rid: str, branch: str) -> RouteDecision:
        return RouteDecision(request_id=rid, policy="cost", branch=branch, prefill_node="raypd-prefill-0",
                             decode_node="raypd-decode-0", prompt_tokens=1000, predicted_cached_tokens=900,
                             local_cached_tokens=0, est_ttft_s=0.1)

    got = routing_summary([decision("a", "cold"), decision("b", "tier"), decision("c", "local"), decision("d", "tier")])
    assert got["decisions"] == 4 and got["branches"] == {"cold": 1, "tier": 2, "local": 1}
    assert got["tier_explain"].startswith("d: cost/tier -> prefill raypd-prefill-0")
    assert routing_summary([decision("a", "cold")])["tier_explain"] is None
