"""End to end: `raypd bench soak` for 10 s at 0.8 x capacity on 1 prefill + 1 decode node serving a tiny
random-weight model (tests/tiny_model.py) must fail no request and leave no block held after the drain,
and its JSON must have the documented shape with every raypd process in it. Correctness only: RSS, descriptors, threads and latency are reported, and
their thresholds are the benchmark's own verdict (docs/benchmarks.md), not asserted here.
"""
from __future__ import annotations

import json

import pytest

from tests.bench_process import run_bench

pytestmark = pytest.mark.cluster  # starts `raypd serve` (Ray, Serve, node actors)

TOP_LEVEL = {"requests", "ok", "failed", "rejected", "rss_growth_pct", "fds_growth", "threads_growth",
             "fds_idle_growth", "threads_idle_growth", "blocks_held_after", "latency_per_minute", "verdict",
             "processes", "samples", "config"}
# Processes the soak must find and name: the CLI, Ray's daemons, Serve's, the node actors and the Conductor.
PROCESSES = {"serve-cli", "gcs", "raylet", "ServeController", "ProxyActor", "OpenAIIngress", "NodePool",
             "Conductor", "raypd-prefill-0", "raypd-decode-0"}


def test_a_short_soak_fails_nothing_and_holds_nothing_after(tmp_path, tiny_model_dir):
    out = tmp_path / "soak.json"
    # As a user runs it, in a process of its own (as the chaos bench's test does: a process that already
    # started Ray clusters of its own carries Ray state a bench should not inherit). A short capacity probe,
    # a 2 s warm-up and a sample every 2 s (the 8 s measured window still holds several samples of every
    # process) keep the test's wall time low. The idle samples' settle is short: it only gives the server
    # time to close its keep-alive connections, which the fds verdict (not asserted here) judges. Load
    # 0.4 of capacity and a probe of 4 in flight: requests still overlap (what the no-failure and no-held
    # assertions need), at half the CPU of the default 0.8, which the suite's other workers want; no
    # dashboard (its head starts a process per module, a burst the suite's other Ray starts share).
    args = ["soak", "--duration", "10", "--warmup", "2", "--sample-every", "2", "--load", "0.4",
            "--probe-duration", "2", "--probe-concurrency", "4", "--idle-settle", "1",
            "--json", str(out), "--log-dir", str(tmp_path / "logs"), "--serve-args",
            f"--model {tiny_model_dir} --kv-cache-memory 64 --no-dashboard"]
    code, _, stderr = run_bench(args)
    assert out.exists(), stderr[-3000:]
    report = json.loads(out.read_text())
    assert code == 0, (report["notes"], stderr[-3000:])
    assert TOP_LEVEL <= set(report)
    assert report["requests"] > 0 and report["failed"] == 0, (report["failed_by_reason"], report["failure_examples"])
    assert report["ok"] + report["rejected"] == report["requests"]
    assert report["blocks_held_after"] == 0 and report["held_after"]["counts_total"] == 0, report["held_after"]
    assert PROCESSES <= set(report["processes"]), sorted(report["processes"])
    for key in ("rss_growth_pct", "fds_growth", "threads_growth"):
        assert set(report[key]) == set(report["processes"])
        assert all(report[key][p] is not None for p in PROCESSES), report[key]
    assert all(report["fds_idle_growth"][p] is not None for p in PROCESSES), report["fds_idle_growth"]
    minute = report["latency_per_minute"][0]
    assert minute["ok"] > 0 and all(minute[f"{m}_p{q}_s"] is not None for m in ("ttft", "e2e") for q in (50, 90, 99))
    assert set(report["verdict"]) >= {"no_failed_requests", "no_blocks_held_after", "fds_flat", "threads_flat", "pass"}
    assert report["processes_left_after"] == []  # the server's tree and every process naming its Ray cluster
