"""End to end: `raypd bench autoscale --short` (a few seconds per phase) on `raypd serve --autoscale
mixed=1:3` serving a tiny random-weight model (tests/tiny_model.py), started and stopped by the bench.
Correctness only: the JSON has the documented shape with every phase, every request was answered
(200), /health was read through the run with the autoscale key, the timeline covers the run, the
picture was written, and nothing of the server is left. Whether the pool grows within seconds is
the scaler's timing, not asserted here; the figures are the benchmark's (docs/benchmarks.md)."""
from __future__ import annotations

import json

import pytest

from raypd.benchmarks.autoscale.plan import PHASES
from tests.bench_process import run_bench

pytestmark = pytest.mark.cluster  # starts `raypd serve` (Ray, Serve, node actors)

TOP_LEVEL = {"config", "calibration", "plan", "settle", "phases", "total", "recovery", "cool_down", "scaling", "lost",
             "must_hold", "timeline", "pool_changes", "autoscale_orders", "health", "client", "requests", "servers",
             "notes"}
PHASE = {"requests", "completed", "met", "attainment", "by_status", "errors", "lost", "ttft_p50_s", "ttft_p99_s",
         "tpot_p50_s", "tpot_p99_s", "offered_rps"}


def test_a_short_run_measures_every_phase_and_leaves_nothing(tmp_path, tiny_model_dir):
    out = tmp_path / "autoscale.json"
    # As a user runs it, in a process of its own. A given base rate (no calibration server) and phases
    # shorter than --short's (2 + 3 + 3 s; /health read every 0.5 s, so still well over 10 reads) keep
    # the wall time to one server's start and stop and 8 s of load.
    args = ["autoscale", "--short", "--warm", "2", "--step", "3", "--cool", "3", "--sample-every", "0.5",
            "--base-rate", "3", "--warmup", "1", "--output-len", "8",
            "--out", str(out), "--log-dir", str(tmp_path / "logs"),
            "--serve-args", f"--model {tiny_model_dir} --kv-cache-memory 64"]
    code, stdout, stderr = run_bench(args, timeout_s=600)
    assert out.exists(), stderr[-3000:]
    report = json.loads(out.read_text())
    assert code == 0, (report["notes"], stderr[-3000:])
    assert TOP_LEVEL <= set(report)
    assert report["calibration"]["base_rate_given"] and report["calibration"]["step_rate_rps"] == 9
    assert [p["name"] for p in report["plan"]] == list(PHASES) and list(report["phases"]) == list(PHASES)
    for name, phase in report["phases"].items():
        assert PHASE <= set(phase) and phase["requests"] > 0, name
        assert phase["by_status"]["200"] == phase["requests"] and phase["lost"] == 0, phase["errors"]
    assert report["lost"]["total"] == 0 and report["client"]["cancelled"] == 0
    assert report["settle"]["at_min"]
    health = report["health"]
    assert health["autoscale_key_seen"] and len(health["samples"]) >= 10
    assert all(s["roles"]["mixed"]["live"] >= 1 for s in health["samples"])
    assert report["timeline"][0]["start_s"] == 0 and report["timeline"][-1]["end_s"] == report["plan"][-1]["start_s"] \
        + report["plan"][-1]["duration_s"]
    assert set(report["scaling"]) == {"mixed"} and report["scaling"]["mixed"]["at_step_start"] == 1
    assert all(v is None or isinstance(v, bool) for v in report["must_hold"].values())
    assert len(report["requests"]["rows"]) == report["total"]["requests"]
    [server] = report["servers"]
    assert server["label"] == "autoscale" and "--autoscale mixed=1:3" in server["command"]
    assert server["processes_left_after"] == []
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for line in ("\nwarm ", "\nstep ", "\ncool ", "recovery: ", "lost: ", "must hold: scaled_up"):
        assert line in stdout, line
