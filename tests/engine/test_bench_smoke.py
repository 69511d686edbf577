"""`python benchmarks/engine_throughput.py` end to end on a tiny workload, both systems: the report
has throughput, latencies, the ratio and the token-match fraction. No timing is asserted."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

ROOT = Path(__file__).resolve().parents[2]


def test_engine_benchmark_reports_both_systems(tmp_path):
    out = tmp_path / "engine.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_throughput.py"), "--num-requests", "4",
                    "--concurrency", "2", "--max-tokens-range", "4,8", "--prompt-len-range", "20,40",
                    "--json", str(out)], check=True, timeout=600, capture_output=True)
    report = json.loads(out.read_text())
    raypd, hf = report["results"]["raypd"]["2"], report["results"]["hf"]["2"]
    for s in (raypd, hf):
        assert s["output_tok_s"] > 0
        assert {"ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "tpot_p99_s"} <= s.keys()
    assert raypd["ratio_vs_hf"] == raypd["output_tok_s"] / hf["output_tok_s"]
    assert raypd["hf_identical_tokens_frac"] == 1.0  # greedy, float32: the same tokens
