"""From a phase's results to its figures, and from the phases to the comparisons the issue asks for.

Per stream: requests sent, completed, 429s (`rejected`), 5xx, cancelled at the phase's end, errors by
kind; TTFT p50/p99 over the requests the server accepted (not 429), where one that never got a first
token (cancelled at the phase's end, timed out, failed) counts as an infinite TTFT, so a starved
tenant's p99 is unbounded rather than hidden; TPOT p50 over the completed; goodput = requests meeting
both SLOs (bench serve's SLO) / the phase's elapsed time. Percentiles are nearest-rank (an observed
value; `inf` survives). Per phase: the same totals over both streams.

Comparisons, each against `a_alone`:
    a_ttft_p99_ratio            A's TTFT p99 in the phase / alone (must hold: <= 1.5 with fairness on,
                                and for the high priority in `priority`)
    step_ratio                  the mean step of the node that computes A's prompt (prefill, else mixed,
                                flex, decode) in the phase / alone (step_times.py)
    a_ttft_p99_ratio_at_alone_step   a_ttft_p99_ratio / step_ratio: the rise left once each step
                                costs what it cost alone
    rise_explained_by_step      (step_ratio - 1) / (a_ttft_p99_ratio - 1), within [0, 1]: the share
                                of the rise that is the dearer shared step
and work conservation: total goodput with fairness (flood_fair) against without (flood_unfair).
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from raypd.benchmarks.serve.client import Result
from raypd.benchmarks.serve.metrics import SLO
from raypd.benchmarks.tenants.traffic import CANCELLED

REJECTED = "http_429"
MUST_HOLD_RATIO = 1.5
FIRST_TOKEN_ROLES = ("prefill", "mixed", "flex", "decode")  # who computes A's prompt, by preference


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (an observed value, so inf stays inf); None without values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q, method="inverted_cdf"))


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den; None when either is unknown or den is 0; inf when num is."""
    if num is None or den is None or den <= 0 or math.isinf(den):
        return None
    return num / den


def stream_figures(results: list[Result], slo: SLO, elapsed_s: float) -> dict:
    ok = [r for r in results if r.ok]
    accepted = [r for r in results if r.error != REJECTED]
    ttfts = [r.ttft_s if r.ttft_s is not None else math.inf for r in accepted]
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    errors = Counter(r.error for r in results if r.error)
    good = sum(1 for r in results if slo.met(r))
    per_s = (lambda n: n / elapsed_s) if elapsed_s > 0 else (lambda n: 0.0)
    return {"requests": len(results), "completed": len(ok), "rejected_429": errors.get(REJECTED, 0),
            "http_5xx": sum(n for e, n in errors.items() if e.startswith("http_5")),
            "cancelled": errors.get(CANCELLED, 0), "without_first_token": sum(1 for t in ttfts if math.isinf(t)),
            "errors": dict(errors),
            "error_examples": {r.error: r.detail for r in reversed(results) if r.error and r.error != CANCELLED},
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
            "tpot_p50_s": percentile(tpots, 50), "slo_met": good, "goodput_rps": per_s(good),
            "throughput_rps": per_s(len(ok)), "output_tokens_per_s": per_s(sum(r.output_tokens or 0 for r in ok))}


def total_figures(streams: dict[str, dict], elapsed_s: float) -> dict:
    keys = ("requests", "completed", "rejected_429", "http_5xx", "cancelled", "slo_met")
    out = {k: sum(s[k] for s in streams.values()) for k in keys}
    per_s = (lambda n: n / elapsed_s) if elapsed_s > 0 else (lambda n: 0.0)
    out |= {"goodput_rps": per_s(out["slo_met"]), "throughput_rps": per_s(out["completed"]),
            "output_tokens_per_s": sum(s["output_tokens_per_s"] for s in streams.values())}
    return out


def first_token_role(*step_summaries: dict) -> str | None:
    """The role whose steps A's first token waits for, present in every summary given."""
    return next((r for r in FIRST_TOKEN_ROLES if all(r in s for s in step_summaries)), None)


def step_effect(a_ratio: float | None, alone_steps: dict, phase_steps: dict) -> dict:
    """How much of A's TTFT rise (a_ratio, p99 against alone) is the dearer shared step."""
    role = first_token_role(alone_steps, phase_steps)
    step_ratio = None if role is None else ratio(phase_steps[role]["step_time_mean_s"],
                                                 alone_steps[role]["step_time_mean_s"])
    decode_ratio = ratio(phase_steps.get("decode", {}).get("step_time_mean_s"),
                         alone_steps.get("decode", {}).get("step_time_mean_s"))
    at_alone_step = ratio(a_ratio, step_ratio) if a_ratio is not None and not math.isinf(a_ratio) else None
    explained = None
    if a_ratio is not None and step_ratio is not None and not math.isinf(a_ratio):
        explained = 1.0 if a_ratio <= 1.0 else min(1.0, max(0.0, (step_ratio - 1.0) / (a_ratio - 1.0)))
    return {"step_role": role, "step_ratio": step_ratio, "decode_step_ratio": decode_ratio,
            "a_ttft_p99_ratio_at_alone_step": at_alone_step, "rise_explained_by_step": explained}


def comparisons(phases: dict[str, dict]) -> tuple[dict, dict]:
    """(per flood phase: A's TTFT p99 against alone and the step's part in it, plus the work
    conservation check; the must-hold verdicts, None where a figure is missing)."""
    alone = phases.get("a_alone")
    alone_p99 = alone["streams"]["a"]["ttft_p99_s"] if alone else None
    out: dict = {}
    for name in ("flood_fair", "priority", "flood_unfair"):
        phase = phases.get(name)
        if phase is None:
            continue
        a_ratio = ratio(phase["streams"]["a"]["ttft_p99_s"], alone_p99)
        out[name] = {"a_ttft_p99_ratio": a_ratio,
                     **step_effect(a_ratio, alone["step_times"] if alone else {}, phase["step_times"])}
    fair, unfair = phases.get("flood_fair"), phases.get("flood_unfair")
    if fair and unfair:
        out["work_conserving"] = {
            "goodput_rps_fair": fair["total"]["goodput_rps"], "goodput_rps_unfair": unfair["total"]["goodput_rps"],
            "throughput_rps_fair": fair["total"]["throughput_rps"],
            "throughput_rps_unfair": unfair["total"]["throughput_rps"]}

    def at_most(name: str) -> bool | None:
        r = out.get(name, {}).get("a_ttft_p99_ratio")
        return None if r is None else r <= MUST_HOLD_RATIO
    work = out.get("work_conserving")
    must = {"a_ttft_p99_fair_at_most_1.5x_alone": at_most("flood_fair"),
            "high_priority_ttft_p99_at_most_1.5x_alone": at_most("priority"),
            "total_goodput_fair_not_below_unfair":
                None if work is None else work["goodput_rps_fair"] >= work["goodput_rps_unfair"]}
    return out, must
