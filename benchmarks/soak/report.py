"""From the soak's records and samples to the JSON report, its verdict and a short table.

JSON, top level: requests, ok, failed (any failure but admission's 429), rejected (429),
failed_by_reason, capacity_rps, offered_rps, achieved_rps (ok / load seconds), rss_growth_pct /
fds_growth / threads_growth {process label: growth over the measured load (growth.py), null for a
process not alive through it}, fds_idle_growth / threads_idle_growth {process label: the idle sample
after the last drain - the one after the warm-up, null for a process not alive at both},
blocks_held_after (the nodes' KV blocks in use once idle after the drain; null if unknown), held_after (the nodes' held counts then), latency_per_minute (latency.py),
verdict {each must-hold: true/false, pass}; then what explains them: processes {label: pid, role,
name, cmdline, first / baseline / end / max RSS in MiB, fds and threads at baseline and end},
capacity_probe, late (arrivals that waited for a free slot), drain_s, samples {per process: t_s,
rss_mib, fds, threads; nodes: t_s, blocks_in_use per node, held; requests: [send s, TTFT s, E2E s,
"ok" or the failure reason] each}, notes, config (with thresholds and growth_definition).
"""
from __future__ import annotations

from collections import Counter

from raypd.benchmarks.chaos.driver import Record
from raypd.benchmarks.chaos.held_blocks import HeldAfter
from raypd.benchmarks.soak.capacity import Capacity
from raypd.benchmarks.soak.driver import OpenLoopResult
from raypd.benchmarks.soak.growth import Growth, alive_through, growth
from raypd.benchmarks.soak.latency import is_rejected, per_bucket
from raypd.benchmarks.soak.monitor import Monitor
from raypd.benchmarks.soak.sampler import ProcessSampler, Series

MIB = 1 << 20
GROWTH_DEFINITION = ("per process, over the samples of the measured load (config.window_s: after the warm-up "
                     "and the idle sample, to the end of the load): baseline = the first sample; end = the mean "
                     "of the last tail_samples samples (at most half the window's); growth = end - baseline, "
                     "rss_growth_pct = 100 x growth / baseline. A process not alive through the whole window is not compared. "
                     "fds_idle_growth / threads_idle_growth: the second idle sample minus the first "
                     "(config.idle_sample_s: after the warm-up and after the last drain, no request in flight, "
                     "the client closed); fds_flat and threads_flat are judged on these.")


def _r(v: float | None, digits: int = 2) -> float | None:
    return None if v is None else round(v, digits)


def process_growth(series: dict[str, Series], start_s: float, end_s: float, period_s: float,
                   tail: int) -> dict[str, dict[str, Growth | None]]:
    """label -> {"rss", "fds", "threads"} -> Growth (None when not comparable)."""
    out = {}
    for label, s in series.items():
        ok = alive_through(s.t_s, start_s, end_s, period_s)
        out[label] = {k: growth(s.t_s, getattr(s, k), start_s, end_s, tail) if ok else None
                      for k in ("rss", "fds", "threads")}
    return out


def idle_growth(idle: ProcessSampler, labels: dict[int, str]) -> dict[str, dict[str, int]]:
    """label -> {"fds", "threads"}: the last idle sample minus the first, for processes in both."""
    out = {}
    for pid, s in idle.series.items():
        if len(s.t_s) >= 2 and s.t_s[0] == idle.times[0] and s.t_s[-1] == idle.times[-1]:
            label = labels.get(pid, f"{s.label}[{pid}]")
            out[label] = {"fds": s.fds[-1] - s.fds[0], "threads": s.threads[-1] - s.threads[0]}
    return out


def verdict(report: dict, rss_limit_pct: float, fds_tolerance: float, threads_tolerance: float) -> dict:
    """Each must-hold of the soak, and `pass` when all hold. Unknowns (no growth, no blocks) fail."""
    rss = [v for v in report["rss_growth_pct"].values() if v is not None]
    fds = [v for v in report["fds_idle_growth"].values() if v is not None]
    threads = [v for v in report["threads_idle_growth"].values() if v is not None]
    checks = {
        "no_failed_requests": report["requests"] > 0 and report["failed"] == 0,
        "no_blocks_held_after": report["blocks_held_after"] == 0 and report["held_after"]["counts_total"] == 0,
        f"rss_growth_under_{rss_limit_pct:g}_pct": bool(rss) and max(rss) < rss_limit_pct,
        "fds_flat": bool(fds) and max(fds) <= fds_tolerance,
        "threads_flat": bool(threads) and max(threads) <= threads_tolerance,
    }
    return checks | {"pass": all(checks.values())}


def build_report(records: list[Record], load: OpenLoopResult, capacity: Capacity, offered_rps: float,
                 series: dict[str, Series], idle: ProcessSampler, monitor: Monitor, held: HeldAfter,
                 window_start_s: float, window_end_s: float, period_s: float, tail: int, thresholds: dict,
                 notes: list[str], config: dict) -> dict:
    """The report; growth is measured over [window_start_s, window_end_s] (the measured load)."""
    ok = [r for r in records if r.outcome.ok]
    rejected = sum(1 for r in records if is_rejected(r))
    by_reason = Counter(r.outcome.reason for r in records if not r.outcome.ok and not is_rejected(r))
    grown = process_growth(series, window_start_s, window_end_s, period_s, tail)
    at_idle = idle_growth(idle, {s.pid: label for label, s in series.items()})
    known = held.unreadable is None and not held.errors
    report: dict = {
        "requests": len(records), "ok": len(ok), "failed": sum(by_reason.values()), "rejected": rejected,
        "failed_by_reason": dict(by_reason),
        "capacity_rps": round(capacity.rps, 4), "offered_rps": round(offered_rps, 4),
        "achieved_rps": round(len(ok) / load.load_s, 4) if load.load_s > 0 else None,
        "rss_growth_pct": {k: _r(g["rss"].growth_pct if g["rss"] else None) for k, g in grown.items()},
        "fds_growth": {k: _r(g["fds"].growth if g["fds"] else None) for k, g in grown.items()},
        "threads_growth": {k: _r(g["threads"].growth if g["threads"] else None) for k, g in grown.items()},
        "fds_idle_growth": {k: at_idle[k]["fds"] if k in at_idle else None for k in (*series, *at_idle)},
        "threads_idle_growth": {k: at_idle[k]["threads"] if k in at_idle else None for k in (*series, *at_idle)},
        "blocks_held_after": held.blocks_total if known and held.blocks_in_use else None,
        "held_after": {"counts_total": held.total if known else None, "per_node": held.per_node,
                       "blocks_in_use": held.blocks_in_use, "idle": held.idle, "waited_s": round(held.waited_s, 1),
                       "errors": held.errors, "unreadable": held.unreadable},
        "latency_per_minute": per_bucket(records),
    }
    report["verdict"] = verdict(report, **thresholds)
    report |= {
        "processes": {label: _process_entry(s, grown[label]) for label, s in series.items()},
        "capacity_probe": capacity.as_json(),
        "late": load.late, "drain_s": round(load.drain_s, 2),
        "failure_examples": {r.outcome.reason: r.outcome.detail for r in records if not r.outcome.ok},
        "samples": {
            "processes": {label: {"t_s": [round(t, 1) for t in s.t_s], "rss_mib": [round(v / MIB, 1) for v in s.rss],
                                  "fds": s.fds, "threads": s.threads} for label, s in series.items()},
            "nodes": {"t_s": [round(t, 1) for t in monitor.node_t_s],
                      "blocks_in_use": {name: [b.get(name) for b in monitor.blocks_in_use]
                                        for name in sorted({n for b in monitor.blocks_in_use for n in b})},
                      "held": monitor.held, "unreadable_samples": monitor.node_errors},
            "requests": [[round(r.start_s, 2), _r(r.outcome.ttft_s, 4), _r(r.outcome.e2e_s, 4),
                          r.outcome.reason or "ok"] for r in records],
        },
        "notes": notes, "config": config | {"thresholds": thresholds, "growth_definition": GROWTH_DEFINITION},
    }
    return report


def _process_entry(s: Series, g: dict[str, Growth | None]) -> dict:
    rss, fds, threads = g["rss"], g["fds"], g["threads"]
    return {"pid": s.pid, "role": s.role, "name": s.name, "cmdline": s.cmdline[:160],
            "compared": rss is not None, "samples": len(s.t_s),
            "rss_mib_first": _r(s.rss[0] / MIB if s.rss else None, 1),
            "rss_mib_baseline": _r(rss.baseline / MIB if rss else None, 1),
            "rss_mib_end": _r(rss.end / MIB if rss else None, 1),
            "rss_mib_max": _r(rss.window_max / MIB if rss else None, 1),
            "fds_baseline": fds.baseline if fds else None, "fds_end": _r(fds.end if fds else None),
            "fds_max": fds.window_max if fds else None,
            "threads_baseline": threads.baseline if threads else None,
            "threads_end": _r(threads.end if threads else None), "threads_max": threads.window_max if threads else None}


def _s(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def format_table(report: dict) -> str:
    lines = [
        f"requests {report['requests']}: ok {report['ok']}, failed {report['failed']} "
        f"{report['failed_by_reason'] or ''}, rejected (429) {report['rejected']}".replace("  ", " "),
        f"capacity {report['capacity_rps']:.3f} req/s, offered {report['offered_rps']:.3f}, "
        f"achieved {_s(report['achieved_rps'], '.3f')}; late arrivals {report['late']}",
        f"blocks held after drain {_s(report['blocks_held_after'], 'd')} "
        f"(held counts {_s(report['held_after']['counts_total'], 'd')})",
        f"{'process':<28} {'pid':>7} {'RSS MiB base':>12} {'end':>8} {'growth %':>8} {'fds idle':>9} "
        f"{'threads':>9}",
    ]
    for label, p in report["processes"].items():
        g = report["rss_growth_pct"][label]
        fd, th = report["fds_idle_growth"].get(label), report["threads_idle_growth"].get(label)
        lines.append(f"{label[:28]:<28} {p['pid']:>7} {_s(p['rss_mib_baseline'], '.1f'):>12} "
                     f"{_s(p['rss_mib_end'], '.1f'):>8} {_s(g, '+.2f'):>8} "
                     f"{_s(p['fds_baseline'], '.0f'):>4}{_s(fd, '+d'):>5} "
                     f"{_s(p['threads_baseline'], '.0f'):>4}{_s(th, '+d'):>5}")
    lines.append(f"{'minute':>6} {'req':>5} {'ok':>5} {'fail':>4} {'429':>4} {'TTFT p50/p90/p99 s':>20} "
                 f"{'E2E p50/p90/p99 s':>20}")
    for m in report["latency_per_minute"]:
        lines.append(f"{m['minute']:>6} {m['requests']:>5} {m['ok']:>5} {m['failed']:>4} {m['rejected']:>4} "
                     f"{'/'.join(_s(m[f'ttft_p{q}_s'], '.2f') for q in (50, 90, 99)):>20} "
                     f"{'/'.join(_s(m[f'e2e_p{q}_s'], '.2f') for q in (50, 90, 99)):>20}")
    v = report["verdict"]
    lines.append("verdict: " + ", ".join(f"{k} {'yes' if ok else 'NO'}" for k, ok in v.items() if k != "pass")
                 + f" -> {'PASS' if v['pass'] else 'FAIL'}")
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
