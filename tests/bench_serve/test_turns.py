"""TTFT split by turn for multi-turn sessions: first turns against returning ones (a conversation
coming back with its history), in the summary, the table and the JSON of a run."""
from __future__ import annotations

import json

import pytest

from raypd.benchmarks.serve.client import Result
from raypd.benchmarks.serve.metrics import SLO, summarize
from raypd.benchmarks.serve.report import format_table, system_entry
from raypd.benchmarks.serve.runner import RunResult


def _result(turn: int, ttft: float, error: str | None = None) -> Result:
    return Result(ttft_s=None if error else ttft, e2e_s=None if error else ttft + 0.1, error=error, output_tokens=3,
                  turn=turn)


def test_summary_splits_ttft_by_turn():
    results = [_result(1, 1.0), _result(1, 3.0), _result(2, 0.2), _result(3, 0.4), _result(2, 0.6),
               _result(2, 9.0, error="timeout")]  # a failed returning turn has no TTFT to count
    s = summarize(RunResult(results, 10.0, None), SLO(2.0, 1.0))
    assert s["ttft_first_p50_s"] == pytest.approx(2.0) and s["ttft_first_p99_s"] == pytest.approx(2.98)
    assert s["ttft_returning_p50_s"] == pytest.approx(0.4) and s["ttft_returning_mean_s"] == pytest.approx(0.4)
    assert s["ttft_returning_p90_s"] == pytest.approx(0.56)
    assert s["ttft_p50_s"] == pytest.approx(0.6)  # the unsplit figures stay as they were


def test_single_turn_sessions_have_no_split():
    s = summarize(RunResult([_result(1, 1.0), _result(1, 2.0)], 1.0, None), SLO(2.0, 1.0))
    assert not any(k.startswith(("ttft_first", "ttft_returning")) for k in s)
    assert "returning" not in format_table("x", system_entry(0.0, [{**s, "rate": None, "passed": False}]))


def test_table_shows_both_turn_kinds():
    results = [_result(1, 1.0), _result(2, 0.25)]
    s = summarize(RunResult(results, 1.0, None), SLO(2.0, 1.0))
    table = format_table("sys", system_entry(s["goodput_rps"], [{**s, "rate": None, "passed": True}]))
    head, row = table.splitlines()[1:3]
    assert "TTFT 1st turn p50/p90/p99 ms" in head and "TTFT returning p50/p90/p99 ms" in head
    assert "1000/1000/1000" in row and "250/250/250" in row


def test_a_multiturn_run_reports_turns_and_tier_figures(fake_server, tmp_path, monkeypatch, capsys):
    """Through main: the runner numbers each session's turns, and the nodes' tier totals on
--ray-address (read here by a stand-in, before and after the run) become the run's kv_tier figures."""
    from raypd.benchmarks.serve import main as bench
    from raypd.benchmarks.serve.tier.node_stats import TierReader

    readings = iter([[{"kv_tier_disk_loaded": 5, "kv_tier_lookup_blocks": 10}, {}],
                     [{"kv_tier_disk_loaded": 11, "kv_tier_disk_load_seconds": 0.5, "kv_tier_lookup_blocks": 18}, {}]])
    addresses = []

    def reader(address: str) -> TierReader:
        addresses.append(address)
        return TierReader(address, read=lambda _: next(readings))
    monkeypatch.setattr(bench, "TierReader", reader)
    out = tmp_path / "r.json"
    assert bench.main(["--base-url", fake_server, "--dataset", "multiturn", "--conversations", "3", "--turns", "2",
                       "--multiturn-user-len", "8", "--multiturn-output-len", "5", "--warmup", "0",
                       "--ray-address", "192.0.2.7:6379", "--json", str(out)]) == 0
    entry = json.loads(out.read_text())["systems"]["endpoint"]
    assert entry["completed"] == 6 and entry["ttft_first_p50_s"] > 0 and entry["ttft_returning_p50_s"] > 0
    assert addresses == ["192.0.2.7:6379"]
    assert entry["kv_tier"]["lookup_blocks"] == 8 and entry["kv_tier"]["disk"]["loaded_blocks"] == 6
    assert entry["kv_tier"]["hit_rate"] == pytest.approx(0.75)
    printed = capsys.readouterr().out
    assert "TTFT returning" in printed and "KV tier disk: hit rate 75% of 8 blocks past the pool" in printed
