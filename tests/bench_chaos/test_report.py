"""The report's arithmetic on hand-made runs: failures by reason, availability, identical counts per
sampling kind (only ok requests with an ok reference are checked), percentiles, blocks held."""
from __future__ import annotations

import json

import pytest

from raypd.benchmarks.chaos.client import Outcome
from raypd.benchmarks.chaos.driver import Record
from raypd.benchmarks.chaos.held_blocks import HeldAfter, sum_held
from raypd.benchmarks.chaos.report import build_report, format_table, percentile, write_json
from raypd.benchmarks.chaos.workload import build_requests

REQUESTS = build_requests(4, seed=0)  # greedy chat, greedy completion, seeded chat, seeded completion


def ok(text: str, ttft: float = 0.1, e2e: float = 1.1, tokens: int = 11, finish: str = "length") -> Outcome:
    return Outcome(text=text, finish_reason=finish, completion_tokens=tokens, ttft_s=ttft, e2e_s=e2e)


def failed(reason: str, detail: str = "") -> Outcome:
    return Outcome(reason=reason, detail=detail)


def rec(index: int, outcome: Outcome, cycle: int = 0) -> Record:
    return Record(index, cycle, 0.0, outcome)


REFERENCE = [rec(0, ok("a")), rec(1, ok("b")), rec(2, ok("c")), rec(3, failed("http_503"))]


def report(chaos: list[Record], held: HeldAfter | None = None) -> dict:
    return build_report(REQUESTS, REFERENCE, chaos, kills=[], recovery_s=[], kill_failures=[],
                        held=held or HeldAfter(), notes=[], config={})


def test_failures_by_reason_and_availability():
    chaos = [rec(0, ok("a")), rec(1, failed("http_503", "no node")), rec(2, failed("stream_error", "node died")),
             rec(0, failed("http_503", "again"), cycle=1), rec(1, ok("b"), cycle=1)]
    r = report(chaos)
    assert (r["requests"], r["ok"], r["failed"]) == (5, 2, 3)
    assert r["failed_by_reason"] == {"http_503": 2, "stream_error": 1}
    assert r["availability"] == pytest.approx(0.4)
    assert r["failure_examples"] == {"http_503": "again", "stream_error": "node died"}


def test_identical_counts_per_kind_skip_failed_and_unreferenced():
    chaos = [rec(0, ok("a")), rec(0, ok("a!"), cycle=1),         # greedy: one identical, one not
             rec(1, ok("b", finish="stop")),                     # same text, other finish_reason: not identical
             rec(2, ok("c")), rec(2, failed("timeout")),         # seeded: the failure is not checked
             rec(3, ok("d"))]                                    # reference failed: not checked
    r = report(chaos)
    assert (r["greedy_checked"], r["greedy_identical"]) == (3, 1)
    assert (r["seeded_checked"], r["seeded_identical"]) == (1, 1)
    assert [(m["index"], m["cycle"], m["got"]) for m in r["mismatches"]] == [(0, 1, "a!"), (1, 0, "b")]
    assert r["reference"] == {"requests": 4, "failed": 1, "failed_by_reason": {"http_503": 1}}


def test_latency_percentiles_over_ok_requests():
    chaos = [rec(0, ok("a", ttft=t, e2e=t + 1.0, tokens=11)) for t in (0.1, 0.2, 0.3, 0.4, 2.0)]
    chaos.append(rec(1, failed("timeout")))
    r = report(chaos)
    assert r["ttft_p99_s"] == pytest.approx(percentile([0.1, 0.2, 0.3, 0.4, 2.0], 99))
    assert r["ttft_p99_s"] == pytest.approx(0.4 + 0.96 * 1.6)     # linear between the two largest
    assert r["tpot_p99_s"] == pytest.approx(0.1)                   # (e2e - ttft) / (11 - 1)
    assert percentile([], 99) is None
    assert Outcome(text="x", finish_reason="stop", completion_tokens=1, ttft_s=0.1, e2e_s=0.2).tpot_s is None


def test_nothing_sent_has_no_availability():
    r = report([])
    assert r["availability"] is None and r["ttft_p99_s"] is None
    assert "availability -" in format_table(r)


def test_held_blocks_sum_every_node_and_count_errors_apart():
    body = {"nodes": [{"name": "p0", "held": {"requests": 0, "reservations": 2, "streams": 1}, "idle": False},
                      {"name": "d0", "held": {"requests": 1, "note": "x", "flag": True}},
                      {"name": "d1", "error": "RayActorError: dead"}]}
    held = sum_held(body)
    assert held.total == 4 and held.errors == {"d1": "RayActorError: dead"} and not held.idle
    assert held.per_node["d0"] == {"requests": 1}
    idle = sum_held({"nodes": [{"name": "p0", "held": {"requests": 0}}, {"name": "d0", "held": {"streams": 0}}]})
    assert idle.total == 0 and idle.idle
    assert sum_held({"detail": "no"}).unreadable
    assert report([], idle)["blocks_held_after"] == 0
    assert report([], sum_held({"detail": "no"}))["blocks_held_after"] is None


def test_json_has_the_issue_fields_and_table_lists_kills(tmp_path):
    kills = [{"t_s": 30.0, "target": "raypd-decode-0", "kind": "sigkill", "role": "decode", "pid": 1,
              "incarnation_before": 0}]
    r = build_report(REQUESTS, REFERENCE, [rec(0, ok("a"))], kills, [4.5], [
        {"t_s": 60.0, "kind": "engine_crash", "target": "raypd-decode-1", "error": "no crash_engine()"}],
        HeldAfter(), ["a note"], {"command": "x"})
    write_json(tmp_path / "out" / "r.json", r)
    data = json.loads((tmp_path / "out" / "r.json").read_text())
    for key in ("requests", "ok", "failed", "failed_by_reason", "availability", "greedy_checked", "greedy_identical",
                "seeded_checked", "seeded_identical", "kills", "recovery_s", "blocks_held_after", "ttft_p99_s",
                "tpot_p99_s"):
        assert key in data, key
    assert data["kills"] == kills and data["recovery_s"] == [4.5]
    table = format_table(r)
    assert "sigkill" in table and "after 4.5s" in table and "NOT DONE: no crash_engine()" in table
    assert "note: a note" in table
