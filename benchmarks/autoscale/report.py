"""The report: the figures assembled from what the load step measured, a summary on stdout, JSON.

JSON: {"config": {command, settings, slo, pool, machine_cpus, date}, "calibration": {capacity,
base_rate_rps, step_rate_rps, base_rate_given}, "plan": [{name, start_s, duration_s, rate}], "settle":
{at_min, waited_s, pool}, "phases": {warm|step|cool: figures.py's group figures}, "total": {...},
"recovery": timeline.py's rule plus after_peak_s (from when the pool first reached its peak; negative:
attainment was back before the last node came), "cool_down": {buckets, buckets_below_target,
lowest_attainment}, "scaling": {role: pool.py's scaling}, "lost": figures.py's lost, "must_hold":
{...: true/false/null}, "timeline": [bucket], "pool_changes": [{t_s, roles}], "autoscale_orders":
[raw order], "health": {samples: [{t_s, http, status, roles, autoscale?}], unreadable,
autoscale_key_seen}, "client": {late, open_after_arrivals, cancelled, elapsed_s}, "requests":
{columns, rows}, "servers": [{label, command, log, processes_left_after}], "notes": [...]}. Times in
seconds from the warm phase's start unless a name says from what; rates in requests per second.

Must hold (reported; not the exit status):
    scaled_up                   the pool grew during the step (some role's peak above its count at
                                the step's start)
    recovered_within_<N>s       recovery_s (timeline.py) is known and <= --recover-within
    scale_down_lost_none        no request lost in the cool-down, nor among those open while a node drained
    scaled_back_to_min          every role back at its minimum before the samples end
"""
from __future__ import annotations

from collections.abc import Sequence

from raypd.benchmarks.autoscale.figures import group_figures, lost_figures, phase_figures
from raypd.benchmarks.autoscale.plan import Phase
from raypd.benchmarks.autoscale.pool import changes, scaling
from raypd.benchmarks.autoscale.records import COLUMNS
from raypd.benchmarks.autoscale.run import Measured
from raypd.benchmarks.autoscale.timeline import buckets, cool_down, recovery
from raypd.benchmarks.serve.metrics import SLO
from raypd.benchmarks.tenants.capacity import Capacity


def must_hold(recovered: dict, scaled: dict[str, dict], lost: dict, recover_within_s: float) -> dict:
    """The verdicts (module docstring); None where the run cannot say (no step bucket with requests,
    a pool that never grew or never shrank)."""
    grew = any(r["peak_live"] is not None and r["peak_live"] > r["at_step_start"] for r in scaled.values())
    shrank = any(r["first_drain_s"] is not None or (r["peak_live"] or 0) > (r["live_at_end"] or 0)
                 for r in scaled.values())
    recovery_s = recovered["recovery_s"]
    return {"scaled_up": grew if scaled else None,
            f"recovered_within_{recover_within_s:g}s": None if not recovered["rated_buckets"]
            else recovery_s is not None and recovery_s <= recover_within_s,
            "scale_down_lost_none": lost["cool"] == 0 and lost["lost_open_while_draining"] == 0 if shrank else None,
            "scaled_back_to_min": all(r["back_to_min_s"] is not None for r in scaled.values()) if grew else None}


def after_peak(recovery_s: float | None, scaled: dict[str, dict]) -> float | None:
    """Seconds from the moment the pool first reached its peak (the latest such moment over the roles
    that grew) to the recovery; None when the pool did not grow or attainment did not recover."""
    peaks = [r["peak_s"] for r in scaled.values()
             if r["peak_s"] is not None and r["peak_live"] is not None and r["peak_live"] > r["at_step_start"]]
    return None if recovery_s is None or not peaks else recovery_s - max(peaks)


def build_report(config: dict, capacity: Capacity | None, base_rate: float, phases: list[Phase], measured: Measured,
                 slo: SLO, least: dict[str, int], bucket_s: float, recover_within_s: float, servers: list[dict],
                 notes: list[str]) -> dict:
    records, samples = measured.records, measured.samples
    timeline = buckets(records, phases, samples, slo, bucket_s)
    step = next(p for p in phases if p.name == "step")
    cool = next(p for p in phases if p.name == "cool")
    scaled = scaling(samples, step, cool, least) if samples else {}
    recovered = recovery(timeline, step, slo.attainment)
    recovered["after_peak_s"] = after_peak(recovered["recovery_s"], scaled)
    lost = lost_figures(records, samples)
    notes = list(notes)
    if not measured.settle.get("at_min", True):
        notes.append(f"the pool was not at its minimum {least} when the load step began: {measured.settle}")
    if not any(s.autoscale is not None for s in samples):
        notes.append("/health carried no \"autoscale\" key: nodes starting are not counted")
    if recovered["never_recovered"]:
        notes.append("attainment was still below the target in the step's last bucket: it never recovered")
    return {"config": config,
            "calibration": {"capacity": capacity.as_json() if capacity else None, "base_rate_rps": base_rate,
                            "step_rate_rps": step.rate, "base_rate_given": capacity is None},
            "plan": [{"name": p.name, "start_s": p.start_s, "duration_s": p.duration_s, "rate": p.rate}
                     for p in phases],
            "settle": measured.settle,
            "phases": phase_figures(records, phases, slo),
            "total": group_figures(records, slo, phases[-1].end_s),
            "recovery": recovered, "cool_down": cool_down(timeline, slo.attainment), "scaling": scaled, "lost": lost,
            "must_hold": must_hold(recovered, scaled, lost, recover_within_s),
            "timeline": [b.as_json() for b in timeline],
            "pool_changes": changes(samples), "autoscale_orders": measured.orders,
            "health": {"samples": [s.as_json() for s in samples], "unreadable": measured.health_unreadable,
                       "autoscale_key_seen": any(s.autoscale is not None for s in samples)},
            "client": {"late": measured.late, "open_after_arrivals": measured.open_after_arrivals,
                       "cancelled": measured.cancelled, "elapsed_s": round(measured.elapsed_s, 3)},
            "requests": {"columns": list(COLUMNS), "rows": [r.row() for r in records]},
            "servers": servers, "notes": notes}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _after(v: float | None) -> str:
    return "-" if v is None else f"+{v:.0f} s"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _columns(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *rows]]


def _recovery(rec: dict) -> str:
    if rec["never_recovered"]:
        return "never: attainment still below the target in the step's last bucket"
    if rec["recovery_s"] is None:
        return "- (no bucket of the step had requests)"
    if not rec["dipped"]:
        return "attainment never fell below the target in the step"
    peak = "" if rec.get("after_peak_s") is None else f", {rec['after_peak_s']:+.0f} s from the pool's peak"
    return (f"{rec['recovery_s']:.0f} s after the step began{peak} ({rec['buckets_below_target']} bucket(s) below "
            f"the target)")


def format_summary(report: dict) -> str:
    cal, slo = report["calibration"], report["config"]["slo"]
    cap = cal["capacity"]
    source = "given" if cap is None else f"{report['config']['settings']['base_load']:g} x capacity {cap['rps']:.3g}"
    lines = [f"== raypd bench autoscale: base {cal['base_rate_rps']:.3g} req/s ({source}), step "
             f"{cal['step_rate_rps']:.3g} req/s; SLO TTFT {slo['ttft_s']:g} s, TPOT {slo['tpot_s']:g} s, "
             f"attainment target {slo['attainment']:g}"]
    head = ("phase", "rate", "requests", "met", "attainment", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
            "200/429/503/other/exc")
    rows = []
    for p in report["plan"]:
        f = report["phases"][p["name"]]
        rows.append((p["name"], f"{p['rate']:.3g}", str(f["requests"]), str(f["met"]), _pct(f["attainment"]),
                     f"{_ms(f['ttft_p50_s'])}/{_ms(f['ttft_p99_s'])}", f"{_ms(f['tpot_p50_s'])}/{_ms(f['tpot_p99_s'])}",
                     "/".join(str(n) for n in f["by_status"].values())))
    lines += _columns(head, rows)
    roles = sorted({role for b in report["timeline"] for role in b["nodes"]})
    bucket_rows = [(f"{b['start_s']:g}-{b['end_s']:g}", b["phase"], f"{b['offered_rps']:.2f}", _pct(b["attainment"]),
                    *(f"{b['nodes'][r]['live']}/{b['nodes'][r]['draining']}" if r in b["nodes"] else "-" for r in roles))
                   for b in report["timeline"]]
    lines.append("timeline (buckets by arrival; nodes: most live/draining seen in the bucket):")
    lines += _columns(("t s", "phase", "offered", "attainment", *(f"{r} nodes" for r in roles)), bucket_rows)
    lines.append("recovery: " + _recovery(report["recovery"]))
    for role, s in report["scaling"].items():
        lines.append(f"scaling {role}: {s['at_step_start']} -> peak {s['peak_live']} live; from the step's start: first "
                     f"up {_after(s['first_up_s'])}, peak {_after(s['peak_s'])}; from the cool-down's start: first "
                     f"drain {_after(s['first_drain_s'])}, back to {s['least']} {_after(s['back_to_min_s'])}; "
                     f"{s['live_at_end']} live at the end")
    lost = report["lost"]
    lines.append(f"lost: {lost['cool']} in the cool-down, {lost['total']} in all; {lost['open_while_draining']} "
                 f"requests open while a node drained, {lost['lost_open_while_draining']} of them lost")
    for check, ok in report["must_hold"].items():
        lines.append(f"must hold: {check}: {'-' if ok is None else ('yes' if ok else 'NO')}")
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
