"""End to end: `raypd bench chaos` for 9 s on 1 prefill + 2 decode nodes, killing decode nodes and
the Conductor every 4 s (a ray.kill, then a SIGKILL), must lose no request, change no output and leak
no block. The nodes serve a tiny random-weight model (tests/tiny_model.py): what is checked is that
outputs do not change under faults, not the real model's tokens. Correctness only: no timing is asserted.
"""
from __future__ import annotations

import json

import pytest

from tests.bench_process import run_bench

pytestmark = pytest.mark.cluster  # starts `raypd serve` (Ray, Serve, node actors)


def test_short_chaos_run_loses_nothing(tmp_path, tiny_model_dir):
    out = tmp_path / "chaos.json"
    # As a user runs it: in a process of its own (it joins the server's Ray as a driver, which a test
    # process that already started Ray clusters of its own cannot do cleanly). Two kills are what is
    # asserted: the second comes while the first member may still be recovering (the schedule then
    # picks another live one), and the run ends once both have recovered. 12 distinct requests (each
    # endpoint x sampling combination three times) keep the fault-free run short.
    args = ["chaos", "--duration", "9", "--prefill-nodes", "1", "--decode-nodes", "2", "--kill-every", "4",
            "--num-requests", "12", "--targets", "decode,conductor", "--json", str(out),
            "--log-dir", str(tmp_path / "logs"),
            "--serve-args", f"--model {tiny_model_dir} --kv-cache-memory 64"]
    code, _, stderr = run_bench(args)
    assert out.exists(), stderr[-3000:]
    report = json.loads(out.read_text())
    assert code == 0, (report["notes"], stderr[-3000:])
    assert report["requests"] > 0 and report["availability"] == 1.0, report["failed_by_reason"]
    assert report["greedy_checked"] > 0 and report["greedy_identical"] == report["greedy_checked"], report["mismatches"]
    assert report["seeded_checked"] > 0 and report["seeded_identical"] == report["seeded_checked"], report["mismatches"]
    assert report["reference"]["failed"] == 0
    assert report["blocks_held_after"] == 0, report["nodes_after"]
    assert len(report["kills"]) == 2 and report["kill_failures"] == [], report["kill_failures"]
    assert {k["kind"] for k in report["kills"]} == {"ray_kill", "sigkill"}
    assert len(report["recovery_s"]) == 2 and all(r is not None for r in report["recovery_s"]), report["notes"]
    assert report["processes_left_after"] == []  # the server's tree and every process naming its Ray address
