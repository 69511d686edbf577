"""The report: one table per system on stdout, and the JSON file.

JSON: {"config": {...}, "systems": {name: {goodput_rps, the figures of the run at the goodput rate
(the lowest rate if none passed; the only run without a sweep): ttft/tpot/itl/e2e _mean_s _p50_s
_p90_s _p99_s, request_throughput, output_throughput, completed, errors, ...}, "sweep": [every
step's figures with its rate]}}. Latencies in seconds, throughputs per second. Multi-turn sessions
add ttft_first_* and ttft_returning_* (metrics.py); a raypd system adds kv_tier, its tiers' figures
over the run (tier/figures.py; null without a tier, {"error": ...} when unread).
"""
from __future__ import annotations

import json
from pathlib import Path

from raypd.benchmarks.serve.tier.figures import format_lines


def system_entry(goodput_rps: float, steps: list[dict]) -> dict:
    passed = [s for s in steps if s.get("passed")]
    chosen = max(passed, key=lambda s: s["rate"]) if passed else min(steps, key=lambda s: s.get("rate") or 0)
    return {**chosen, "goodput_rps": goodput_rps, "reported_rate": chosen.get("rate"), "sweep": steps}


def write_json(path: Path, config: dict, systems: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"config": config, "systems": systems}, indent=2, default=str) + "\n")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _percentiles(s: dict, name: str) -> str:
    return "/".join(_ms(s.get(f"{name}_{p}_s")) for p in ("p50", "p90", "p99"))


def format_table(name: str, entry: dict) -> str:
    steps = entry.get("sweep") or [entry]
    turns = any("ttft_returning_p50_s" in s for s in steps)
    head = ("rate", "done", "errors", "req/s", "tok/s", "TTFT p50/p99 ms",
            *(("TTFT 1st turn p50/p90/p99 ms", "TTFT returning p50/p90/p99 ms") if turns else ()),
            "TPOT p50/p99 ms", "ITL p99 ms", "E2E p99 ms", "SLO met", "cached")
    rows = []
    for s in steps:
        rate = s.get("rate") or s.get("offered_rate")
        cached = s.get("cached_prompt_share")
        rows.append((
            "max" if rate is None else f"{rate:.3g}", f"{s['completed']}/{s['requests']}",
            ",".join(f"{k}:{v}" for k, v in sorted(s["errors"].items())) or "0",
            f"{s['request_throughput']:.2f}", f"{s['output_throughput']:.1f}",
            f"{_ms(s['ttft_p50_s'])}/{_ms(s['ttft_p99_s'])}",
            *((_percentiles(s, "ttft_first"), _percentiles(s, "ttft_returning")) if turns else ()),
            f"{_ms(s['tpot_p50_s'])}/{_ms(s['tpot_p99_s'])}",
            _ms(s["itl_p99_s"]), _ms(s["e2e_p99_s"]), f"{s['slo_attainment']:.0%}",
            "-" if cached is None else f"{cached:.0%}"))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = [f"== {name}: goodput {entry['goodput_rps']:.3g} req/s",
             "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    if "kv_tier" in entry:  # the reported run's; a raypd system without a tier says so
        lines += format_lines(entry["kv_tier"])
    routing = entry.get("routing")
    if routing:
        lines.append(f"  Conductor, last {routing['decisions']} decisions by branch: "
                     + ", ".join(f"{k} {v}" for k, v in sorted(routing["branches"].items())))
        if routing.get("tier_explain"):
            lines += ["  a decision served from a tier:", *("    " + x for x in routing["tier_explain"].splitlines())]
    return "\n".join(lines)
