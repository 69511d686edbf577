"""`raypd bench serve --base-url` end to end against the fake server: the JSON's structure, the
goodput sweep's steps, and the errors in the report."""
from __future__ import annotations

import json

import pytest

from raypd.benchmarks.serve.main import main

FIGURES = [f"{m}_{s}_s" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "p50", "p90", "p99")]
REQUIRED = [*FIGURES, "request_throughput", "output_throughput", "goodput_rps", "completed", "errors"]


def _dataset(tmp_path, prompts):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "max_tokens": 5}) + "\n" for p in prompts))
    return path


def test_single_run_report(fake_server, tmp_path, capsys):
    data = _dataset(tmp_path, ["ok"] * 6 + ["500", "drop"])
    out = tmp_path / "r.json"
    assert main(["--base-url", fake_server, "--label", "fake", "--dataset-file", str(data), "--json", str(out),
                 "--request-rate", "50", "--warmup", "1", "--slo-ttft", "5", "--slo-tpot", "5"]) == 0
    report = json.loads(out.read_text())
    assert set(report) == {"config", "systems"} and list(report["systems"]) == ["fake"]
    fake = report["systems"]["fake"]
    assert all(k in fake for k in REQUIRED), [k for k in REQUIRED if k not in fake]
    assert fake["completed"] == 6 and fake["errors"] == {"http_500": 1, "disconnected": 1}
    assert fake["slo_attainment"] == 6 / 8 and fake["cached_prompt_share"] == 3 / 7
    assert report["config"]["slo"] == {"ttft_s": 5.0, "tpot_s": 5.0, "attainment": 0.9}
    assert "== fake: goodput" in capsys.readouterr().out


def test_sweep_report(fake_server, tmp_path):
    data = _dataset(tmp_path, ["ok"] * 4)
    out = tmp_path / "r.json"
    pytest.importorskip("matplotlib")  # the optional `docs` extra
    png = tmp_path / "r.png"
    assert main(["--base-url", fake_server, "--dataset-file", str(data), "--json", str(out), "--sweep",
                 "--sweep-rates", "20,40", "--warmup", "0", "--slo-ttft", "5", "--slo-tpot", "5", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    entry = json.loads(out.read_text())["systems"]["endpoint"]
    assert [s["rate"] for s in entry["sweep"]] == [20.0, 40.0] and all(s["passed"] for s in entry["sweep"])
    assert entry["goodput_rps"] == 40.0 and entry["reported_rate"] == 40.0


def test_sweep_of_a_failing_server_reports_zero(fake_server, tmp_path):
    data = _dataset(tmp_path, ["500"] * 3)
    out = tmp_path / "r.json"
    assert main(["--base-url", fake_server, "--dataset-file", str(data), "--json", str(out), "--sweep",
                 "--sweep-rates", "5,10", "--warmup", "0"]) == 0
    entry = json.loads(out.read_text())["systems"]["endpoint"]
    assert entry["goodput_rps"] == 0.0 and len(entry["sweep"]) == 1 and entry["errors"] == {"http_500": 3}


def test_bad_arguments_exit_2(capsys):
    assert main(["--dataset", "random"]) == 2
    assert main(["--systems", "vllm", "--dataset", "random"]) == 2
    assert "unknown system" in capsys.readouterr().err
