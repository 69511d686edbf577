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


def test_engine_benchmark_reports_both_systems(tmp_path, tiny_model_dir):
    # The tiny model (tests/tiny_model.py): what is checked is the report, not the real model's speed.
    out = tmp_path / "engine.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_throughput.py"), "--model", tiny_model_dir,
                    "--num-requests", "4", "--concurrency", "2", "--max-tokens-range", "4,8", "--prompt-len-range", "20,40",
                    "--json", str(out)], check=True, timeout=600, capture_output=True)
    report = json.loads(out.read_text())
    raypd, hf = report["results"]["raypd"]["2"], report["results"]["hf"]["2"]
    for s in (raypd, hf):
        assert s["output_tok_s"] > 0
        assert {"ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "tpot_p99_s"} <= s.keys()
    assert raypd["ratio_vs_hf"] == raypd["output_tok_s"] / hf["output_tok_s"]
    assert raypd["hf_identical_tokens_frac"] == 1.0  # greedy, float32: the same tokens
    # The outliers and their causes: the slowest steps, the collector's pauses, Triton's compiles
    # (none on the CPU path, and Triton's hooks are found).
    assert 0 < len(raypd["slowest_steps"]) <= 5 and raypd["slowest_steps"][0]["wall_ms"] > 0
    assert {"collections", "full_collections", "max_ms"} <= raypd["gc"].keys()
    assert raypd["triton_compiles"]["count"] == 0


@pytest.mark.serial  # alone after the parallel part: its llama-server and raypd processes want both cores
def test_engine_benchmark_against_llamacpp_with_fp32_agreement(tmp_path, own_processes):
    # llama-server from the same find-or-build function `raypd bench serve` uses (tests/bench_serve
    # builds it first in a clean clone); raypd with int8-g32 weights, so the float32 reference is a
    # separate run.
    from raypd.benchmarks.serve.llamacpp_build import find_or_build_llama_server

    binary = find_or_build_llama_server()
    out = tmp_path / "engine.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_throughput.py"), "--num-requests", "4",
                    "--concurrency", "1,2", "--max-tokens-range", "4,8", "--prompt-len-range", "20,40",
                    "--systems", "raypd,llamacpp", "--llamacpp-server", str(binary), "--quantization", "int8-g32",
                    "--fp32-agreement", "--json", str(out)], check=True, timeout=900, capture_output=True)
    report = json.loads(out.read_text())
    assert report["args"]["quantization"] == "int8-g32" and "llama-server" in report["machine"]["llamacpp"]
    for c in ("1", "2"):
        raypd, peer = report["results"]["raypd"][c], report["results"]["llamacpp"][c]
        assert peer["output_tokens"] == raypd["output_tokens"] and peer["ttft_p99_s"] > 0
        assert raypd["ratio_vs_llamacpp"] == raypd["output_tok_s"] / peer["output_tok_s"]
    agreement = report["fp32_agreement"]
    assert set(agreement) == {"raypd", "llamacpp"}
    for a in agreement.values():
        assert 0 <= a["request_share"] <= 1 and 0 <= a["token_share"] <= 1
    assert not (left := own_processes("llama-server")), left
