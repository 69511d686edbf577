"""`raypd bench gpu-smoke` on this CPU-only host: without CUDA it stops after the environment step
with a clear reason and exit status 2; with `--device cpu --quick` every step runs for real (the
engine, the full-context load, `raypd bench engine`, a 1P+1D `raypd generate --mode pd` on Ray) and leaves no process."""
from __future__ import annotations

import json

import pytest
import torch

from raypd.benchmarks.gpu_smoke import main

pytestmark = pytest.mark.cluster  # the rehearsal starts Ray and subprocesses


@pytest.mark.skipif(torch.cuda.is_available(), reason="the missing-GPU answer needs a host without CUDA")
def test_without_a_gpu_it_says_why_and_exits_2(tmp_path, capsys):
    out = tmp_path / "smoke.json"
    assert main(["--json", str(out)]) == 2
    report = json.loads(out.read_text())
    env = report["steps"][0]
    assert [s["name"] for s in report["steps"]] == ["environment"] and not report["passed"]
    assert "no CUDA device" in env["error"] and env["result"]["versions"]["torch"] == torch.__version__
    assert "no CUDA device" in capsys.readouterr().out


def test_every_step_runs_on_the_cpu(tmp_path, own_processes, tiny_model_dir):
    # On the tiny model (tests/tiny_model.py): the question is whether every step runs and what each
    # reports, not the default model's tokens (the GPU run uses the default model, on which the CPU
    # rehearsal took 25 s of both cores: it ran alone after the parallel part then).
    out = tmp_path / "smoke.json"
    code = main(["--device", "cpu", "--quick", "--max-tokens", "8", "--model", tiny_model_dir, "--json", str(out)])
    report = json.loads(out.read_text())
    steps = {s["name"]: s for s in report["steps"]}
    assert code == 0 and report["passed"], [s["error"] for s in report["steps"] if not s["ok"]]
    assert list(steps) == ["environment", "engine", "full-context", "bench-engine", "generate-pd"]
    full = steps["full-context"]["result"]  # --quick: 4 requests filling a 256-token context
    assert (full["requests"], full["context"], full["prompt_tokens"]) == (4, 256, 256 - 16 - 1)
    # On the CPU, float32 is the reference itself and dtype auto is float32: identical tokens.
    for dtype in ("auto", "float32"):
        assert steps["engine"]["result"][dtype]["identical_token_share"] == 1.0
    assert set(steps["bench-engine"]["result"]) == {"C=1", "C=32"}
    assert steps["bench-engine"]["result"]["C=1"]["output_tok_s"] > 0
    # PD over Ray gives the single engine's greedy tokens (the PD parity invariant).
    assert steps["generate-pd"]["result"]["identical_to_engine_step"] == {"token_share": 1.0, "requests": 1.0}
    assert not (left := own_processes("raypd", "ray::", "raylet", "gcs_server")), left
