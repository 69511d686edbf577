"""The soak's JSON: its top-level keys, growth per process by label, the verdict's must-holds, the
table and the picture, from hand-made samples (no server)."""
from __future__ import annotations

import json

import pytest

from raypd.benchmarks.chaos.client import Outcome
from raypd.benchmarks.chaos.driver import Record
from raypd.benchmarks.chaos.held_blocks import sum_held
from raypd.benchmarks.soak.capacity import Capacity
from raypd.benchmarks.soak.driver import OpenLoopResult
from raypd.benchmarks.soak.monitor import Monitor
from raypd.benchmarks.soak.report import build_report, format_table
from raypd.benchmarks.soak.sampler import ProcessSampler, Series

TOP_LEVEL = {"requests", "ok", "failed", "rejected", "rss_growth_pct", "fds_growth", "threads_growth",
             "fds_idle_growth", "threads_idle_growth", "blocks_held_after", "latency_per_minute", "verdict"}
THRESHOLDS = {"rss_limit_pct": 5.0, "fds_tolerance": 0, "threads_tolerance": 0}
MIB = 1 << 20
T = [0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0]


def series(pid: int, role: str, rss_mib: list[float], fds: list[int] | None = None, name: str | None = None,
           t: list[float] | None = None) -> Series:
    t = t or T[:len(rss_mib)]
    return Series(pid, role, f"ray::{role}", started=float(pid), name=name, t_s=list(t),
                  rss=[int(v * MIB) for v in rss_mib], fds=fds or [10] * len(t), threads=[20] * len(t))


def nodes_body(blocks_in_use: int = 0, requests: int = 0) -> dict:
    return {"nodes": [{"name": "raypd-prefill-0", "pid": 11, "held": {"requests": requests, "streams": 0},
                       "load": {"total_blocks": 100, "free_blocks": 100 - blocks_in_use}},
                      {"name": "raypd-decode-0", "pid": 12, "held": {"requests": 0},
                       "load": {"total_blocks": 100, "free_blocks": 100}}]}


def rec(start_s: float, reason: str | None = None) -> Record:
    return Record(0, 0, start_s, Outcome(reason=reason, ttft_s=0.2, e2e_s=1.0, finish_reason="stop"))


def idle_samples(procs: dict[str, Series], fds_after: int = 0, threads_after: int = 0) -> ProcessSampler:
    """Two idle samples of every process: the same counts, plus the given growth after the drain."""
    idle = ProcessSampler(0)
    idle.times = [0.0, 1.0]
    for s in procs.values():
        idle.series[s.pid] = Series(s.pid, s.role, s.cmdline, s.started, t_s=[0.0, 1.0], rss=[1, 1],
                                    fds=[9, 9 + fds_after], threads=[5, 5 + threads_after])
    return idle


def build(procs: dict[str, Series], records: list[Record] | None = None, held_body: dict | None = None,
          idle: ProcessSampler | None = None) -> dict:
    records = records if records is not None else [rec(1.0), rec(12.0), rec(70.0, "http_429")]
    monitor = Monitor(ProcessSampler(0), http=None, base="", period_s=5.0)
    monitor.node_t_s, monitor.blocks_in_use, monitor.held = [0.0, 5.0], [{"raypd-prefill-0": 3}, {}], [1, 0]
    load = OpenLoopResult(records=records, late=0, load_s=30.0, drain_s=1.2)
    cap = Capacity(rps=2.0, ok=20, failed=0, rejected=0, elapsed_s=10.0, concurrency=8)
    return build_report(records, load, cap, 1.6, procs, idle or idle_samples(procs), monitor,
                        sum_held(held_body or nodes_body()), window_start_s=10.0, window_end_s=30.0, period_s=5.0,
                        tail=2, thresholds=THRESHOLDS, notes=["n"], config={"window_s": [10.0, 30.0]})


def test_the_json_has_the_documented_top_level_and_growth_per_process():
    procs = {"raypd-prefill-0": series(11, "PrefillNode", [100, 200, 1000, 1000, 1010, 1020, 1040],
                                       fds=[10, 12, 20, 20, 21, 22, 22], name="raypd-prefill-0"),
             "gcs": series(3, "gcs", [50, 50, 50, 50, 50, 50, 50]),
             "late": series(30, "idle-worker", [40, 40, 40], t=[20.0, 25.0, 30.0])}
    r = build(procs)
    assert TOP_LEVEL <= set(r) and json.loads(json.dumps(r)) == r
    assert (r["requests"], r["ok"], r["failed"], r["rejected"]) == (3, 2, 0, 1)
    assert r["rss_growth_pct"] == {"raypd-prefill-0": 3.0, "gcs": 0.0, "late": None}  # (1030 - 1000) / 1000
    assert r["fds_growth"] == {"raypd-prefill-0": 2.0, "gcs": 0.0, "late": None}
    assert r["threads_growth"]["gcs"] == 0.0
    assert r["fds_idle_growth"] == r["threads_idle_growth"] == {"raypd-prefill-0": 0, "gcs": 0, "late": 0}
    assert r["blocks_held_after"] == 0 and r["held_after"]["counts_total"] == 0
    assert [m["minute"] for m in r["latency_per_minute"]] == [0, 1]
    p = r["processes"]["raypd-prefill-0"]
    assert (p["pid"], p["rss_mib_first"], p["rss_mib_baseline"], p["rss_mib_end"], p["compared"]) == \
        (11, 100.0, 1000.0, 1030.0, True)
    assert r["processes"]["late"]["compared"] is False
    assert r["samples"]["processes"]["gcs"]["rss_mib"] == [50.0] * 7
    assert r["samples"]["nodes"]["blocks_in_use"] == {"raypd-prefill-0": [3, None]}
    assert r["samples"]["requests"][2] == [70.0, 0.2, 1.0, "http_429"]
    assert "growth_definition" in r["config"] and r["config"]["thresholds"] == THRESHOLDS
    assert r["verdict"] == {"no_failed_requests": True, "no_blocks_held_after": True,
                            "rss_growth_under_5_pct": True, "fds_flat": True, "threads_flat": True, "pass": True}


@pytest.mark.parametrize("change, failing", [
    ({"records": [rec(1.0), rec(2.0, "timeout")]}, "no_failed_requests"),
    ({"records": []}, "no_failed_requests"),
    ({"held_body": nodes_body(blocks_in_use=4)}, "no_blocks_held_after"),
    ({"held_body": nodes_body(requests=1)}, "no_blocks_held_after"),
    ({"held_body": {"detail": "no"}}, "no_blocks_held_after"),
    ({"rss": [100, 100, 100, 100, 100, 105, 105]}, "rss_growth_under_5_pct"),
    ({"fds_after": 1}, "fds_flat"),
    ({"threads_after": 2}, "threads_flat"),
])
def test_each_must_hold_fails_the_verdict(change, failing):
    procs = {"x": series(5, "Conductor", change.pop("rss", [100] * 7))}
    idle = idle_samples(procs, change.pop("fds_after", 0), change.pop("threads_after", 0))
    r = build(procs, idle=idle, **change)
    assert r["verdict"][failing] is False and r["verdict"]["pass"] is False
    assert [k for k, v in r["verdict"].items() if not v and k != "pass"] == [failing]


def test_the_table_names_every_process_and_minute():
    r = build({"raypd-decode-0": series(12, "DecodeNode", [100] * 7, name="raypd-decode-0")})
    table = format_table(r)
    assert "raypd-decode-0" in table and "rejected (429) 1" in table and "-> PASS" in table and "note: n" in table


def test_the_picture_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    from raypd.benchmarks.soak.plot import plot

    r = build({"raypd-decode-0": series(12, "DecodeNode", [100, 101, 102, 103, 103, 103, 103]),
               "gcs": series(3, "gcs", [50] * 7)})
    plot(tmp_path / "soak.png", r, "title")
    assert (tmp_path / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fds_under_load_are_reported_but_flatness_is_judged_at_idle():
    # The proxy holds a socket per client connection: more under load at the end, the same at idle.
    procs = {"ProxyActor": series(4, "ProxyActor", [100] * 7, fds=[80, 80, 80, 82, 79, 86, 88])}
    r = build(procs)
    assert r["fds_growth"]["ProxyActor"] == 7.0 and r["fds_idle_growth"]["ProxyActor"] == 0
    assert r["verdict"]["fds_flat"] is True
    idle = idle_samples(procs)
    del idle.series[4]
    r = build(procs, idle=idle)  # not alive at both idle samples: nothing to judge, so not flat
    assert r["fds_idle_growth"] == {"ProxyActor": None} and r["verdict"]["fds_flat"] is False
