"""The report: JSON and a table on stdout.

JSON: {"config": {...}, "capacity": {rps, completed, failed, elapsed_s, concurrency, measured},
"phases": {name: {fairness, elapsed_s, streams: {"a"|"b": figures.py's stream figures plus tenant,
priority, rate, late, open_at_phase_end}, total, step_times: {role: {step_time_mean_s, running_mean,
samples}}, held_after}}, "comparison": {flood phase: {a_ttft_p99_ratio, step_role, step_ratio,
decode_step_ratio, a_ttft_p99_ratio_at_alone_step, rise_explained_by_step}, work_conserving: {...}},
"must_hold": {...: true/false/null}, "servers": [{fairness, command, log, processes_left_after}],
"notes": [...]}. Seconds and requests per second; an infinite TTFT percentile (a request that never got
its first token) is written as null, and a note says so.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from raypd.benchmarks.tenants.phases import PHASES


def finite(value):
    """The value with every infinite float replaced by None (JSON has no infinity)."""
    if isinstance(value, float) and math.isinf(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def unbounded_notes(phases: dict[str, dict]) -> list[str]:
    notes = []
    for name, phase in phases.items():
        for stream, s in phase["streams"].items():
            if s["without_first_token"]:
                bounded = s["ttft_p99_s"] is not None and not math.isinf(s["ttft_p99_s"])
                notes.append(f"{name}: {s['without_first_token']} of stream {stream}'s accepted requests got no first "
                             f"token within the phase (cancelled at its end or failed)"
                             + ("" if bounded else "; its TTFT p99 is unbounded (null)"))
    return notes


def write_json(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(finite(report), indent=2, default=str) + "\n")


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return "inf" if math.isinf(v) else f"{v * 1000:.0f}"


def _x(v: float | None) -> str:
    if v is None:
        return "-"
    return "inf" if math.isinf(v) else f"{v:.2f}x"


def format_table(report: dict) -> str:
    head = ("phase", "fair", "A done", "A TTFT p50/p99 ms", "A TPOT p50 ms", "A 429", "B done", "B goodput",
            "B 429", "goodput", "tok/s", "5xx", "step ms by role")
    rows = []
    for name in PHASES:
        p = report["phases"].get(name)
        if p is None:
            continue
        a, b, t = p["streams"]["a"], p["streams"].get("b"), p["total"]
        steps = ", ".join(f"{role} {_ms(s['step_time_mean_s'])}" for role, s in p["step_times"].items()) or "-"
        rows.append((name, "on" if p["fairness"] else "off", f"{a['completed']}/{a['requests']}",
                     f"{_ms(a['ttft_p50_s'])}/{_ms(a['ttft_p99_s'])}", _ms(a["tpot_p50_s"]), str(a["rejected_429"]),
                     "-" if b is None else f"{b['completed']}/{b['requests']}",
                     "-" if b is None else f"{b['goodput_rps']:.3g}", "-" if b is None else str(b["rejected_429"]),
                     f"{t['goodput_rps']:.3g}", f"{t['output_tokens_per_s']:.1f}", str(t["http_5xx"]), steps))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)] if rows else [len(h) for h in head]
    cap = report.get("capacity") or {}
    lines = [f"== raypd bench tenants: capacity {cap.get('rps', 0):.3g} req/s"
             f" ({'measured' if cap.get('measured') else 'given'})",
             "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    for name, c in report.get("comparison", {}).items():
        if name == "work_conserving":
            lines.append(f"total goodput with fairness {c['goodput_rps_fair']:.3g} req/s, without "
                         f"{c['goodput_rps_unfair']:.3g} (throughput {c['throughput_rps_fair']:.3g} vs "
                         f"{c['throughput_rps_unfair']:.3g} req/s)")
            continue
        explained = c["rise_explained_by_step"]
        lines.append(f"{name}: A's TTFT p99 {_x(c['a_ttft_p99_ratio'])} alone; {c['step_role'] or '?'} step "
                     f"{_x(c['step_ratio'])} alone (decode {_x(c['decode_step_ratio'])}); at the alone step's cost "
                     f"{_x(c['a_ttft_p99_ratio_at_alone_step'])}; the step explains "
                     + ("-" if explained is None else f"{explained:.0%}") + " of the rise")
    for check, ok in report.get("must_hold", {}).items():
        lines.append(f"must hold: {check}: {'-' if ok is None else ('yes' if ok else 'NO')}")
    lines += [f"note: {n}" for n in report.get("notes", [])]
    return "\n".join(lines)
