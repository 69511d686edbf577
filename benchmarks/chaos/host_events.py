"""The lab's host faults in the report, and the run's verdict (issue 32, must-hold 3).

Per host fault (killer.HostFault): the streams that were on the host (in flight at the fault, routed
by the Conductor's latest decision to a node on it: the response id a client sees is the request id
its routes carry, `<id>-<choice>` and `-retryN` for a retry), each one's outcome and how long until
it was served again (the end of its longest wait for text after the fault: the replay's or the
retry's first token, or the link back),
and for a partition whether the host's nodes came back under the same names with no duplicate member.

The verdict's rules, each with the requests or events that break it:

    completes         every chaos-run request that had a live prefill host and a live decode host for
                      its whole life finished (a host is not live while lost or cut off)
    identical         every fault-free request succeeded, and every successful chaos-run request gave
                      the fault-free run's text and finish reason (greedy and seeded alike)
    nothing_held      every node answered idle after the drain, holding no block
    serves_again      every partitioned host's nodes were live again (same names, none listed twice)
                      after the link came back (only when a partition was done)
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from raypd.benchmarks.chaos.driver import Record
from raypd.benchmarks.chaos.ray_cluster import Route

_ATTEMPT = re.compile(r"^(.*)-\d+(?:-retry\d+)?$")
MAX_LISTED = 10
SERVED_ROLES = ("prefill", "decode")


def routes_by_response(routes: Mapping[str, Route], before: float) -> dict[str, tuple[str, str]]:
    """Response id -> (prefill, decode) of its latest attempt decided at or before `before` (the
    Conductor's time.time()); a replay decided after the fault does not hide where it was."""
    out: dict[str, tuple[str, str, float]] = {}
    for request_id, (prefill, decode, at) in routes.items():
        m = _ATTEMPT.match(request_id)
        if m and at <= before and at >= out.get(m.group(1), ("", "", -1.0))[2]:
            out[m.group(1)] = (prefill, decode, at)
    return {rid: (p, d) for rid, (p, d, _) in out.items()}


def _ended(rec: Record) -> float:
    ended = rec.outcome.ended_s
    return rec.start_s + ended if ended is not None else float("inf")


def longest_pause(rec: Record, t: float) -> tuple[float | None, float | None]:
    """(the longest wait for text after `t`, from `t` or a piece of text to the next; when that wait
    ended, from `t`): when the stream was served again. Text already on its way arrives just after a
    fault, so the first piece after it says nothing. (None, None) without text after `t`."""
    points = [t, *sorted(rec.start_s + c for c in rec.outcome.chunk_s if rec.start_s + c > t)]
    if len(points) < 2:
        return None, None
    pause, end = max((b - a, b) for a, b in zip(points, points[1:]))
    return round(pause, 3), round(end - t, 3)


def streams_on(fault: Mapping, routes: Mapping[str, Route] | None, records: Sequence[Record]) -> dict:
    """The chaos-run requests in flight at the fault whose route used a node on the host."""
    t = fault["t_s"]
    in_flight = [r for r in records if r.start_s <= t < _ended(r)]
    if routes is None:
        return {"in_flight": len(in_flight), "unknown_route": len(in_flight), "streams": []}
    by_response = routes_by_response(routes, fault["wall_time"])
    nodes = set(fault["nodes"])
    streams, unknown = [], 0
    for r in in_flight:
        route = by_response.get(r.outcome.response_id)
        if route is None:
            unknown += 1
            continue
        legs = [leg for leg, node in zip(SERVED_ROLES, route) if node in nodes]
        if not legs:
            continue
        pause, resumed = longest_pause(r, t)
        streams.append({"index": r.index, "cycle": r.cycle, "response_id": r.outcome.response_id,
                        "legs": legs, "ok": r.outcome.ok, "reason": r.outcome.reason,
                        "served_again_after_s": resumed, "longest_pause_s": pause,
                        "ended_after_s": round(_ended(r) - t, 3) if r.outcome.ended_s is not None else None})
    return {"in_flight": len(in_flight), "unknown_route": unknown, "streams": streams}


def unavailable(faults: Sequence[Mapping], host_roles: Mapping[str, str], end_s: float) -> list[dict]:
    """The windows [from_s, to_s) during which some role (prefill, decode) had no live host."""
    down: dict[str, list[tuple[float, float]]] = {}
    for f in faults:
        until = end_s if f["kind"] == "host_kill" else (f.get("restored_at_s") or end_s)
        down.setdefault(f["host"], []).append((f["t_s"], until))
    times = sorted({t for spans in down.values() for span in spans for t in span})
    windows: list[dict] = []
    for role in SERVED_ROLES:
        hosts = [h for h, r in host_roles.items() if r == role]
        if not hosts:
            continue
        for a, b in zip(times, times[1:]):
            mid = (a + b) / 2
            if all(any(lo <= mid < hi for lo, hi in down.get(h, [])) for h in hosts):
                if windows and windows[-1]["role"] == role and windows[-1]["to_s"] == a:
                    windows[-1]["to_s"] = b
                else:
                    windows.append({"role": role, "from_s": a, "to_s": b})
    return windows


def excused(rec: Record, windows: Sequence[Mapping]) -> bool:
    return any(rec.start_s < w["to_s"] and _ended(rec) > w["from_s"] for w in windows)


def host_events(faults: Sequence[Mapping], routes: Sequence[Mapping[str, Route] | None],
                recovery_s: Sequence[float | None], records: Sequence[Record]) -> list[dict]:
    """Per host fault: what was hit and when, the streams on it, and the way back."""
    out = []
    for fault, fault_routes, back in zip(faults, routes, recovery_s):
        event = dict(fault) | streams_on(fault, fault_routes, records)
        event["nodes_back_after_s"] = back
        if fault["kind"] == "partition":
            restored = fault.get("restored_at_s")
            event["nodes_back_after_restore_s"] = (None if back is None or restored is None
                                                   else round(back - (restored - fault["t_s"]), 3))
        out.append(event)
    return out


def verdict(report: Mapping, records: Sequence[Record], windows: Sequence[Mapping], events: Sequence[Mapping],
            duplicates: Mapping[str, float]) -> dict:
    """The rules above, each {"ok", "detail"}, and "ok" for all of them."""
    failed = [r for r in records if not r.outcome.ok]
    unexcused = [r for r in failed if not excused(r, windows)]
    rules: dict[str, dict] = {
        "completes": {"ok": not unexcused, "detail": {
            "failed": len(failed), "excused_no_live_host": len(failed) - len(unexcused),
            "unexcused": [{"index": r.index, "cycle": r.cycle, "start_s": round(r.start_s, 3),
                           "response_id": r.outcome.response_id, "reason": r.outcome.reason,
                           "detail": r.outcome.detail} for r in unexcused[:MAX_LISTED]]}},
        "identical": {"ok": report["reference"]["failed"] == 0
                      and report["greedy_identical"] == report["greedy_checked"]
                      and report["seeded_identical"] == report["seeded_checked"], "detail": {
            "reference_failed": report["reference"]["failed"],
            "greedy": f"{report['greedy_identical']}/{report['greedy_checked']}",
            "seeded": f"{report['seeded_identical']}/{report['seeded_checked']}",
            "mismatches": report["mismatches"]}},
        "nothing_held": {"ok": report["blocks_held_after"] == 0 and bool((report["nodes_after"] or {}).get("idle")),
                         "detail": {"blocks_held_after": report["blocks_held_after"],
                                    "nodes_after": report["nodes_after"]}},
    }
    partitions = [e for e in events if e["kind"] == "partition"]
    if partitions:
        not_back = [e["host"] for e in partitions if e["nodes_back_after_s"] is None]
        rules["serves_again"] = {"ok": not not_back and not duplicates, "detail": {
            "partitions": len(partitions), "nodes_not_back": not_back, "listed_twice": sorted(duplicates)}}
    return {"ok": all(r["ok"] for r in rules.values()), "rules": rules, "no_live_host": list(windows)}
