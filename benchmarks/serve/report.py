"""The report: one table per system on stdout, and the JSON file.

JSON: {"config": {...}, "systems": {name: {goodput_rps, the figures of the run at the goodput rate
(the lowest rate if none passed; the only run without a sweep): ttft/tpot/itl/e2e _mean_s _p50_s
_p90_s _p99_s, request_throughput, output_throughput, completed, errors, ...}, "sweep": [every
step's figures with its rate]}}. Latencies in seconds, throughputs per second.
"""
from __future__ import annotations

import json
from pathlib import Path


def system_entry(goodput_rps: float, steps: list[dict]) -> dict:
    passed = [s for s in steps if s.get("passed")]
    chosen = max(passed, key=lambda s: s["rate"]) if passed else min(steps, key=lambda s: s.get("rate") or 0)
    return {**chosen, "goodput_rps": goodput_rps, "reported_rate": chosen.get("rate"), "sweep": steps}


def write_json(path: Path, config: dict, systems: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"config": config, "systems": systems}, indent=2, default=str) + "\n")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def format_table(name: str, entry: dict) -> str:
    head = ("rate", "done", "errors", "req/s", "tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "ITL p99 ms",
            "E2E p99 ms", "SLO met", "cached")
    rows = []
    for s in entry.get("sweep") or [entry]:
        rate = s.get("rate") or s.get("offered_rate")
        cached = s.get("cached_prompt_share")
        rows.append((
            "max" if rate is None else f"{rate:.3g}", f"{s['completed']}/{s['requests']}",
            ",".join(f"{k}:{v}" for k, v in sorted(s["errors"].items())) or "0",
            f"{s['request_throughput']:.2f}", f"{s['output_throughput']:.1f}",
            f"{_ms(s['ttft_p50_s'])}/{_ms(s['ttft_p99_s'])}", f"{_ms(s['tpot_p50_s'])}/{_ms(s['tpot_p99_s'])}",
            _ms(s["itl_p99_s"]), _ms(s["e2e_p99_s"]), f"{s['slo_attainment']:.0%}",
            "-" if cached is None else f"{cached:.0%}"))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = [f"== {name}: goodput {entry['goodput_rps']:.3g} req/s",
             "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)
