"""End to end: `raypd bench chaos` for 40 s on 1 prefill + 2 decode nodes, killing decode nodes and
the Conductor every 15 s, must lose no request, change no output and leak no block.
Correctness only: no timing is asserted.
"""
from __future__ import annotations

import json

import pytest

from raypd.benchmarks.chaos.main import main

pytestmark = pytest.mark.cluster  # starts `raypd serve` (Ray, Serve, node actors)


def test_short_chaos_run_loses_nothing(tmp_path):
    out = tmp_path / "chaos.json"
    status = main(["--duration", "40", "--prefill-nodes", "1", "--decode-nodes", "2", "--kill-every", "15",
                   "--targets", "decode,conductor", "--json", str(out), "--log-dir", str(tmp_path / "logs")])
    report = json.loads(out.read_text())
    assert status == 0, report["notes"]
    assert report["requests"] > 0 and report["availability"] == 1.0, report["failed_by_reason"]
    assert report["greedy_checked"] > 0 and report["greedy_identical"] == report["greedy_checked"], report["mismatches"]
    assert report["seeded_checked"] > 0 and report["seeded_identical"] == report["seeded_checked"], report["mismatches"]
    assert report["reference"]["failed"] == 0
    assert report["blocks_held_after"] == 0, report["nodes_after"]
    assert len(report["kills"]) == 2 and report["kill_failures"] == [], report["kill_failures"]
    assert {k["kind"] for k in report["kills"]} == {"ray_kill", "sigkill"}
    assert len(report["recovery_s"]) == 2 and all(r is not None for r in report["recovery_s"]), report["notes"]
    assert report["processes_left_after"] == []  # the server's tree and every process naming its Ray address
