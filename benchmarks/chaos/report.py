"""From the two runs, the kills and the drain to the JSON report and a short table.

JSON, top level: requests, ok, failed, failed_by_reason {reason: count}, availability (ok / requests;
null without requests), greedy_checked / greedy_identical and seeded_checked / seeded_identical (ok
chaos-run requests whose fault-free reference was ok, and how many of those gave the same text and
finish_reason), kills [{t_s, target, kind, role, pid, incarnation_before}], recovery_s (one per kill,
same order; null when it did not recover in time), blocks_held_after, ttft_p99_s, tpot_p99_s; then
what explains them: kill_failures, reference {requests, failed, failed_by_reason}, mismatches (the
first few), failure_examples {reason: detail}, nodes_after {held per node, errors}, notes, config.
On the lab, host_events (host_events.py: per host kill or partition, the streams on the host and the
way back); every run, verdict {ok, rules {completes, identical, nothing_held[, serves_again]}}.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from raypd.benchmarks.chaos.driver import Record
from raypd.benchmarks.chaos.held_blocks import HeldAfter
from raypd.benchmarks.chaos.host_events import host_events, unavailable, verdict
from raypd.benchmarks.chaos.workload import ChaosRequest

MAX_MISMATCHES = 5


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


def compare(requests: list[ChaosRequest], reference: list[Record], chaos: list[Record]) -> dict:
    """The identical-output counts per sampling kind, and the first mismatches."""
    ref = {r.index: r.outcome for r in reference if r.outcome.ok}
    counts = {"greedy_checked": 0, "greedy_identical": 0, "seeded_checked": 0, "seeded_identical": 0}
    mismatches: list[dict] = []
    for rec in chaos:
        expected = ref.get(rec.index)
        if not rec.outcome.ok or expected is None:
            continue
        kind = requests[rec.index].sampling
        counts[f"{kind}_checked"] += 1
        if rec.outcome.same_output(expected):
            counts[f"{kind}_identical"] += 1
        elif len(mismatches) < MAX_MISMATCHES:
            mismatches.append({"index": rec.index, "cycle": rec.cycle, "sampling": kind,
                               "endpoint": requests[rec.index].endpoint,
                               "expected": expected.text, "expected_finish": expected.finish_reason,
                               "got": rec.outcome.text, "got_finish": rec.outcome.finish_reason})
    return {**counts, "mismatches": mismatches}


def failures(records: list[Record]) -> tuple[dict[str, int], dict[str, str]]:
    """(count per failure reason, the last detail seen per reason)."""
    by_reason = Counter(r.outcome.reason for r in records if r.outcome.reason is not None)
    examples = {r.outcome.reason: r.outcome.detail for r in records if r.outcome.reason is not None}
    return dict(sorted(by_reason.items())), examples


def build_report(requests: list[ChaosRequest], reference: list[Record], chaos: list[Record], kills: list[dict],
                 recovery_s: list[float | None], kill_failures: list[dict], held: HeldAfter | None,
                 notes: list[str], config: dict, lab: dict | None = None) -> dict:
    """`lab` (lab mode only): host_faults [HostFault.as_json()], routes [one per fault], recovery_s [one
    per fault], host_roles {host: role}, end_s (the chaos run's length), duplicates {name: when}."""
    ok = [r for r in chaos if r.outcome.ok]
    by_reason, examples = failures(chaos)
    ref_by_reason, _ = failures(reference)
    cmp = compare(requests, reference, chaos)
    report = {
        "requests": len(chaos), "ok": len(ok), "failed": len(chaos) - len(ok), "failed_by_reason": by_reason,
        "availability": len(ok) / len(chaos) if chaos else None,
        "greedy_checked": cmp["greedy_checked"], "greedy_identical": cmp["greedy_identical"],
        "seeded_checked": cmp["seeded_checked"], "seeded_identical": cmp["seeded_identical"],
        "kills": kills, "recovery_s": recovery_s,
        "blocks_held_after": held.total if held is not None and held.unreadable is None else None,
        "ttft_p99_s": percentile([r.outcome.ttft_s for r in ok if r.outcome.ttft_s is not None], 99),
        "tpot_p99_s": percentile([t for r in ok if (t := r.outcome.tpot_s) is not None], 99),
        "kill_failures": kill_failures,
        "reference": {"requests": len(reference), "failed": sum(ref_by_reason.values()),
                      "failed_by_reason": ref_by_reason},
        "mismatches": cmp["mismatches"],
        "failure_examples": examples,
        "nodes_after": None if held is None else {
            "held": held.per_node, "errors": held.errors, "idle": held.idle, "waited_s": round(held.waited_s, 1),
            "unreadable": held.unreadable},
        "notes": notes,
        "config": config,
    }
    lab = lab or {}
    events = host_events(lab.get("host_faults", []), lab.get("routes", []), lab.get("recovery_s", []), chaos)
    windows = unavailable(lab.get("host_faults", []), lab.get("host_roles", {}), lab.get("end_s", 0.0))
    if lab:
        report["host_events"] = events
    report["verdict"] = verdict(report, chaos, windows, events, lab.get("duplicates", {}))
    return report


def write_json(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")


def _s(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def format_table(report: dict) -> str:
    avail = report["availability"]
    held = report["blocks_held_after"]
    lines = [
        f"requests {report['requests']}: ok {report['ok']}, failed {report['failed']} "
        f"{report['failed_by_reason'] or ''}".rstrip(),
        f"availability {'-' if avail is None else f'{avail:.4f}'}",
        f"greedy identical {report['greedy_identical']}/{report['greedy_checked']}, "
        f"seeded identical {report['seeded_identical']}/{report['seeded_checked']}",
        f"blocks held after drain {'unknown' if held is None else held}",
        f"TTFT p99 {_s(report['ttft_p99_s'])} s, TPOT p99 {_s(report['tpot_p99_s'], 3)} s",
        f"kills {len(report['kills'])} ({len(report['kill_failures'])} could not be done):",
    ]
    for k, rec in zip(report["kills"], report["recovery_s"]):
        lines.append(f"  t={k['t_s']:7.1f}s  {k['kind']:<12} {k['target']:<24} recovered "
                     f"{'never' if rec is None else f'after {rec:.1f}s'}")
    for f in report["kill_failures"]:
        lines.append(f"  t={f['t_s']:7.1f}s  {f['kind']:<12} {f['target'] or '-':<24} NOT DONE: {f['error']}")
    for e in report.get("host_events", []):
        streams = e["streams"]
        back = [s["served_again_after_s"] for s in streams if s["served_again_after_s"] is not None]
        lines.append(f"  t={e['t_s']:7.1f}s  {e['kind']:<12} {e['host']} ({e['role']}): nodes {sorted(e['nodes'])}, "
                     f"{len(streams)} stream(s) on it ({sum(s['ok'] for s in streams)} ok), served again after "
                     f"{_s(min(back)) if back else '-'}-{_s(max(back)) if back else '-'} s"
                     + (f", nodes back {_s(e['nodes_back_after_restore_s'])} s after the link"
                        if e["kind"] == "partition" else ""))
    v = report.get("verdict")
    if v is not None:
        lines.append("verdict " + ("PASS" if v["ok"] else "FAIL") + ": " + ", ".join(
            f"{name} {'ok' if r['ok'] else 'FAILED'}" for name, r in v["rules"].items()))
        for name, r in v["rules"].items():
            if not r["ok"]:
                lines.append(f"  {name}: {r['detail']}"[:2000])
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
