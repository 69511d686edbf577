"""`raypd bench serve --systems raypd-mixed,llamacpp` for real, on a handful of requests: both are
started, measured on the same prompts and stopped, with no process left behind (systems.py checks by
pid and the bench fails if any is; the test looks for every process it started, wherever it went).
llama-server comes from the same find-or-build function the command uses: the first run builds it
(about 10 minutes on 2 cores)."""
from __future__ import annotations

import json

import pytest

from raypd.benchmarks.serve.llamacpp_build import find_or_build_llama_server
from raypd.benchmarks.serve.main import main


@pytest.mark.cluster
@pytest.mark.serial  # alone after the parallel part: its llama-server and raypd processes want both cores
def test_raypd_mixed_against_llamacpp(tmp_path, own_processes):
    binary = find_or_build_llama_server()
    out = tmp_path / "r.json"
    code = main(["--systems", "raypd-mixed,llamacpp", "--llamacpp-server", str(binary), "--dataset", "gsp",
                 "--gsp-groups", "2", "--gsp-questions", "2", "--gsp-system-len", "96", "--gsp-question-len", "16",
                 "--gsp-output-len", "8", "--max-concurrency", "2", "--warmup", "1", "--slo-ttft", "60",
                 "--slo-tpot", "10", "--json", str(out), "--log-dir", str(tmp_path)])
    assert code == 0
    systems = json.loads(out.read_text())["systems"]
    assert list(systems) == ["raypd-mixed", "llamacpp"]
    for name, s in systems.items():
        assert s["completed"] == 4 and s["errors"] == {}, (name, s)
        assert s["output_tokens"] == 4 * 8 and s["ttft_p99_s"] > 0 and s["cached_prompt_share"] is not None
    assert not (left := own_processes("llama-server", "raypd serve", "ray::")), left
