"""The picture: latency CDFs per system (TTFT, TPOT, ITL, E2E of the run reported for each), and
with a sweep, SLO attainment and p99 TTFT / TPOT against the offered rate. matplotlib is the
optional `docs` extra, imported only here."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from raypd.benchmarks.serve.client import Result


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'raypd[docs]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot(path: Path, title: str, runs: dict[str, list[Result]], systems: dict[str, dict], slo_ttft: float,
         slo_tpot: float, target: float) -> None:
    plt = _pyplot()
    with_sweep = any(len(e.get("sweep") or []) > 1 for e in systems.values())
    fig, axes = plt.subplots(2 if with_sweep else 1, 4, figsize=(18, 8 if with_sweep else 4.2), squeeze=False)
    metrics = {"TTFT": lambda r: [r.ttft_s], "TPOT": lambda r: [r.tpot_s], "ITL": lambda r: r.itl_s,
               "E2E": lambda r: [r.e2e_s]}
    slos = {"TTFT": slo_ttft, "TPOT": slo_tpot}
    for ax, (label, get) in zip(axes[0], metrics.items()):
        for name, results in runs.items():
            vals = np.sort([v for r in results if r.ok for v in get(r) if v is not None])
            if len(vals):
                rate = systems[name].get("reported_rate")
                tag = f"{name} @ {rate:.3g} req/s" if rate else name
                ax.plot(vals, np.arange(1, len(vals) + 1) / len(vals), label=tag)
        if label in slos:
            ax.axvline(slos[label], color="grey", linestyle="--", linewidth=1, label="SLO")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())  # minor tick labels overlap on short log ranges
        ax.set_xlabel(f"{label} (s)")
        ax.set_ylabel("share of requests" if label != "ITL" else "share of gaps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if with_sweep:
        panels = [("slo_attainment", "share meeting both SLOs", None), ("ttft_p99_s", "TTFT p99 (s)", slo_ttft),
                  ("tpot_p99_s", "TPOT p99 (s)", slo_tpot), ("output_throughput", "output tokens/s", None)]
        for ax, (key, ylabel, line) in zip(axes[1], panels):
            for name, entry in systems.items():
                steps = sorted(entry.get("sweep") or [], key=lambda s: s["rate"])
                ax.plot([s["rate"] for s in steps], [s[key] if s[key] is not None else np.nan for s in steps],
                        marker="o", label=f"{name} (goodput {entry['goodput_rps']:.3g})")
            if key == "slo_attainment":
                ax.axhline(target, color="grey", linestyle="--", linewidth=1)
            elif line is not None:
                ax.axhline(line, color="grey", linestyle="--", linewidth=1)
                ax.set_yscale("log")
            ax.set_xlabel("offered rate (requests/s)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
