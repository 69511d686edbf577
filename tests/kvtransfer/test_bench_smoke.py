"""`python benchmarks/kv_transfer.py` end to end on a tiny size: every part of the report is there
(copy, raw CMA, nixl and tcp rows, handoff, targets). No timing is asserted."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

ROOT = Path(__file__).resolve().parents[2]


def test_transfer_benchmark_reports_every_part(tmp_path):
    out = tmp_path / "kv.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kv_transfer.py"), "--sizes", "1,16", "--reps", "1",
                    "--handoff-reps", "2", "--no-progress-thread-compare", "--json", str(out)],
                   check=True, timeout=300, capture_output=True)
    report = json.loads(out.read_text())
    assert {(r["blocks"], r["pattern"]) for r in report["copy"]} == {(n, p) for n in (1, 16) for p in ("contiguous", "scattered")}
    if sys.platform == "linux":
        assert len(report["cma"]) == 4 and all(r["gbps"] > 0 for r in report["cma"])
    assert {(r["backend"], r["blocks"], r["pattern"]) for r in report["transfers"]} == {
        (b, n, p) for b in ("nixl", "tcp") for n in (1, 16) for p in ("contiguous", "scattered")}
    assert set(report["handoff"]) == {"nixl", "tcp"}
    assert any("70% of copy" in t["name"] for t in report["targets"])
