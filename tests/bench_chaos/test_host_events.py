"""The lab's part of the report on hand-made runs: which streams a host fault hit (by the latest route
decided before it), when each was served again, the windows without a live host of a role, and the
verdict's rules, each naming what broke it."""
from __future__ import annotations

from raypd.benchmarks.chaos.client import Outcome
from raypd.benchmarks.chaos.driver import Record
from raypd.benchmarks.chaos.held_blocks import HeldAfter
from raypd.benchmarks.chaos.host_events import excused, routes_by_response, streams_on, unavailable
from raypd.benchmarks.chaos.report import build_report, format_table
from raypd.benchmarks.chaos.workload import build_requests

REQUESTS = build_requests(4, seed=0)
ROLES = {"h1": "prefill", "h2": "decode", "h3": "prefill", "h4": "decode"}


def rec(index: int, start: float, chunks: list[float], rid: str, ok: bool = True, text: str = "a") -> Record:
    out = Outcome(text=text, finish_reason="length", completion_tokens=len(chunks), ttft_s=chunks[0] if chunks else None,
                  response_id=rid, chunk_s=chunks, ended_s=(chunks[-1] if chunks else 1.0) + 0.1)
    if not ok:
        out.reason, out.detail = "stream_error", "node died"
    else:
        out.e2e_s = out.ended_s
    return Record(index, 0, start, out)


def test_a_stream_is_placed_by_its_latest_route_before_the_fault():
    routes = {"r1-0": ("p0", "d0", 100.0), "r1-0-retry1": ("p0", "d1", 105.0), "r2-0": ("p1", "d1", 99.0),
              "chatcmpl-x-y-0": ("p1", "d0", 101.0)}
    assert routes_by_response(routes, before=104.0) == {"r1": ("p0", "d0"), "r2": ("p1", "d1"),
                                                        "chatcmpl-x-y": ("p1", "d0")}
    assert routes_by_response(routes, before=106.0)["r1"] == ("p0", "d1")


def test_streams_on_the_host_and_when_they_were_served_again():
    fault = {"t_s": 10.0, "wall_time": 104.0, "nodes": {"d0": 0}}
    records = [rec(0, 9.0, [0.2, 0.5, 1.05, 3.5, 3.6], "r1"),  # on d0: a piece on its way, then 2.45 s of nothing
               rec(1, 9.5, [0.1, 0.6, 0.9], "r2"),            # in flight on d1: not on the host
               rec(2, 2.0, [0.1, 0.2], "r3"),                 # ended before the fault
               rec(3, 9.9, [], "", ok=False)]                 # no id: route unknown
    got = streams_on(fault, {"r1-0": ("p0", "d0", 100.0), "r2-0": ("p1", "d1", 100.0)}, records)
    assert got["in_flight"] == 3 and got["unknown_route"] == 1
    assert [(s["index"], s["legs"], s["longest_pause_s"], s["served_again_after_s"]) for s in got["streams"]] == [
        (0, ["decode"], 2.45, 2.5)]
    assert streams_on(fault, None, records) == {"in_flight": 3, "unknown_route": 3, "streams": []}


def test_no_live_host_windows_and_which_failures_they_excuse():
    faults = [{"t_s": 30.0, "kind": "host_kill", "host": "h4"},
              {"t_s": 60.0, "kind": "partition", "host": "h2", "restored_at_s": 80.0},
              {"t_s": 90.0, "kind": "partition", "host": "h1", "restored_at_s": 110.0}]
    windows = unavailable(faults, ROLES, end_s=300.0)
    assert windows == [{"role": "decode", "from_s": 60.0, "to_s": 80.0}]   # h3 still serves prefill at 90
    assert excused(rec(0, 79.0, [0.5], "r", ok=False), windows)
    assert not excused(rec(0, 81.0, [0.5], "r", ok=False), windows)
    assert unavailable([{"t_s": 5.0, "kind": "host_kill", "host": "h2"}, {"t_s": 9.0, "kind": "host_kill", "host": "h4"}],
                       ROLES, end_s=50.0) == [{"role": "decode", "from_s": 9.0, "to_s": 50.0}]


def lab_report(chaos: list[Record], back: float | None = 24.0, duplicates: dict | None = None) -> dict:
    reference = [rec(i, 0.0, [0.1], f"ref{i}") for i in range(4)]
    fault = {"t_s": 10.0, "kind": "partition", "host": "h2", "role": "decode", "ip": "198.18.0.12",
             "nodes": {"d0": 0}, "wall_time": 104.0, "processes_killed": 0, "restored_at_s": 30.0, "unknown": "",
             "routes_known": True}
    lab = {"host_faults": [fault], "routes": [{"r1-0": ("p0", "d0", 100.0)}], "recovery_s": [back],
           "host_roles": ROLES, "end_s": 300.0, "duplicates": duplicates or {}}
    return build_report(REQUESTS, reference, chaos, kills=[], recovery_s=[], kill_failures=[], held=HeldAfter(idle=True),
                        notes=[], config={}, lab=lab)


def test_the_verdict_passes_a_clean_run_and_names_what_breaks_it():
    good = lab_report([rec(0, 9.0, [0.2, 3.0], "r1"), rec(1, 12.0, [0.1], "r2")])
    assert good["verdict"]["ok"] and set(good["verdict"]["rules"]) == {"completes", "identical", "nothing_held",
                                                                       "serves_again"}
    event = good["host_events"][0]
    assert event["nodes_back_after_s"] == 24.0 and event["nodes_back_after_restore_s"] == 4.0   # restored 20 s in
    assert [s["index"] for s in event["streams"]] == [0]
    assert "verdict PASS" in format_table(good)

    bad = lab_report([rec(0, 9.0, [0.2], "r1", ok=False), rec(1, 12.0, [0.1], "r2", text="other")], back=None,
                     duplicates={"d0": 31.0})
    rules = bad["verdict"]["rules"]
    assert not bad["verdict"]["ok"]
    assert rules["completes"]["detail"]["unexcused"][0]["response_id"] == "r1"
    assert not rules["identical"]["ok"] and rules["identical"]["detail"]["mismatches"][0]["got"] == "other"
    assert rules["serves_again"]["detail"] == {"partitions": 1, "nodes_not_back": ["h2"], "listed_twice": ["d0"]}
    assert "completes FAILED" in format_table(bad)


def test_a_run_without_the_lab_has_a_verdict_and_no_host_events():
    report = build_report(REQUESTS, [rec(0, 0.0, [0.1], "a")], [rec(0, 1.0, [0.1], "b")], kills=[], recovery_s=[],
                          kill_failures=[], held=HeldAfter(idle=True), notes=[], config={})
    assert "host_events" not in report and report["verdict"]["ok"]
    assert set(report["verdict"]["rules"]) == {"completes", "identical", "nothing_held"}
