"""End to end: `raypd bench tenants` with phases of a few seconds on 1 prefill + 1 decode node serving
a tiny random-weight model (tests/tiny_model.py), both servers (with and without tenant fairness)
started and stopped by the bench. Correctness only: the JSON has the documented shape with every
phase, no request got a 5xx, no node holds anything after a phase, and nothing of either server is
left. The timings and the must-hold verdicts are the benchmark's figures (docs/benchmarks.md), not
asserted here.
"""
from __future__ import annotations

import json

import pytest

from raypd.benchmarks.tenants.phases import PHASES
from tests.bench_process import run_bench

pytestmark = pytest.mark.cluster  # starts `raypd serve` twice (Ray, Serve, node actors)

TOP_LEVEL = {"config", "capacity", "phases", "comparison", "must_hold", "servers", "notes"}
STREAM = {"tenant", "priority", "rate", "requests", "completed", "rejected_429", "http_5xx", "cancelled",
          "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "goodput_rps", "late"}


def test_a_short_run_measures_every_phase_and_leaves_nothing(tmp_path, tiny_model_dir):
    out = tmp_path / "tenants.json"
    # As a user runs it, in a process of its own. A given capacity (no probe) and a gentle "flood" (2x
    # that capacity, not the default 4x: the test asserts the phases' shape, not what a flood does, and
    # the suite's other workers want the CPU) keep the wall time to the two servers' starts and a few seconds per phase.
    args = ["tenants", "--capacity", "5", "--a-load", "0.5", "--b-load", "2", "--phase-duration", "2",
            "--flood-lead", "0.5",
            "--drain-timeout", "5", "--idle-timeout", "45", "--sample-every", "0.5", "--warmup", "1",
            "--input-len", "32", "--output-len", "8", "--json", str(out), "--log-dir", str(tmp_path / "logs"),
            "--serve-args", f"--model {tiny_model_dir} --kv-cache-memory 64"]
    code, stdout, stderr = run_bench(args, timeout_s=600)
    assert out.exists(), stderr[-3000:]
    report = json.loads(out.read_text())
    assert code == 0, (report["notes"], stderr[-3000:])
    assert TOP_LEVEL <= set(report)
    assert report["capacity"]["rps"] == 5 and not report["capacity"]["measured"]
    assert list(report["phases"]) == list(PHASES)
    for name, phase in report["phases"].items():
        assert phase["fairness"] == (name != "flood_unfair")
        assert set(phase["streams"]) == ({"a"} if name == "a_alone" else {"a", "b"})
        for stream in phase["streams"].values():
            assert STREAM <= set(stream) and stream["requests"] > 0
            assert stream["http_5xx"] == 0, stream["error_examples"]
        assert phase["total"]["http_5xx"] == 0
        assert phase["held_after"]["idle"] and phase["held_after"]["total"] == 0, phase["held_after"]
        assert set(phase["step_times"]) <= {"prefill", "decode"}
    assert phase["streams"]["b"]["tenant"] == "tenant-b"
    assert report["phases"]["priority"]["streams"]["a"]["priority"] == -1
    assert set(report["comparison"]) == {"flood_fair", "priority", "flood_unfair", "work_conserving"}
    assert all(v is None or isinstance(v, bool) for v in report["must_hold"].values())
    assert [s["fairness"] for s in report["servers"]] == [True, False]
    assert "--no-tenant-fairness" in report["servers"][1]["command"]
    assert all(s["processes_left_after"] == [] for s in report["servers"])
    for name in PHASES:
        assert f"\n{name} " in stdout
