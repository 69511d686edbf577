"""From a run's results to the reported figures (DESIGN.md "Measuring").

TTFT: send -> first text chunk. TPOT: (E2E - TTFT) / (output tokens - 1), per request. ITL: every
gap between text chunks. E2E: send -> end of stream. Each as mean, p50, p90, p99 in seconds.
A request meets the SLOs when it completed, TTFT <= slo_ttft and TPOT <= slo_tpot (a one-token
answer has no TPOT); attainment = such requests / all requests, errors included. Goodput of one
run = requests meeting the SLOs / duration; of a sweep, the highest rate whose attainment reaches
the target (sweep.py). Token counts come from the server's usage, else from the tokenizer.
When sessions have several requests (multiturn), TTFT is also split by turn: ttft_first_* of the
first turns, ttft_returning_* of the later ones (a conversation coming back, its history resent).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from raypd.benchmarks.serve.client import Result
from raypd.benchmarks.serve.runner import RunResult


@dataclass(frozen=True)
class SLO:
    ttft_s: float
    tpot_s: float
    attainment: float = 0.9

    def met(self, r: Result) -> bool:
        if not r.ok or r.ttft_s is None or r.ttft_s > self.ttft_s:
            return False
        tpot = r.tpot_s
        return tpot is None or tpot <= self.tpot_s


def fill_token_counts(results: list[Result], encode: Callable[[str], list[int]] | None) -> None:
    """Output tokens the server did not report: from the tokenizer, else one per chunk."""
    for r in results:
        if r.ok and r.output_tokens is None:
            r.output_tokens = len(encode(r.text)) if encode else len(r.chunk_times)


def _stats(name: str, values: list[float]) -> dict:
    if not values:
        return {f"{name}_{k}_s": None for k in ("mean", "p50", "p90", "p99")}
    a = np.asarray(values, dtype=float)
    return {f"{name}_mean_s": float(a.mean()), f"{name}_p50_s": float(np.percentile(a, 50)),
            f"{name}_p90_s": float(np.percentile(a, 90)), f"{name}_p99_s": float(np.percentile(a, 99))}


def summarize(run: RunResult, slo: SLO) -> dict:
    ok = [r for r in run.results if r.ok]
    out: dict = {"offered_rate": run.offered_rate, "duration_s": run.duration_s, "requests": len(run.results),
                 "completed": len(ok)}
    out |= _stats("ttft", [r.ttft_s for r in ok if r.ttft_s is not None])
    out |= _stats("tpot", [t for r in ok if (t := r.tpot_s) is not None])
    out |= _stats("itl", [g for r in ok for g in r.itl_s])
    out |= _stats("e2e", [r.e2e_s for r in ok if r.e2e_s is not None])
    if any(r.turn > 1 for r in run.results):
        out |= _stats("ttft_first", [r.ttft_s for r in ok if r.turn == 1 and r.ttft_s is not None])
        out |= _stats("ttft_returning", [r.ttft_s for r in ok if r.turn > 1 and r.ttft_s is not None])
    good = sum(slo.met(r) for r in run.results)
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    reported = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    out |= {
        "request_throughput": len(ok) / run.duration_s if run.duration_s > 0 else 0.0,
        "output_throughput": out_tokens / run.duration_s if run.duration_s > 0 else 0.0,
        "output_tokens": out_tokens, "prompt_tokens": prompt_tokens,
        "slo_met": good, "slo_attainment": good / len(run.results) if run.results else 0.0,
        "goodput_rps": good / run.duration_s if run.duration_s > 0 else 0.0,
        "cached_prompt_share": (sum(r.cached_tokens or 0 for r in reported) / sum(r.prompt_tokens or 0 for r in reported)
                                if reported else None),
        "errors": dict(Counter(r.error for r in run.results if r.error)),
        "error_examples": {r.error: r.detail for r in reversed(run.results) if r.error},
    }
    return out
