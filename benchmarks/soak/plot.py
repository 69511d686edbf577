"""The soak's picture, from its JSON report: RSS of every process over time (absolute, log scale),
each process's RSS relative to its baseline (the measured load's first sample; dotted lines
mark the measured load), and latency over time (every
request's E2E and TTFT as dots at its send time, with the per-minute p50 and p99 as lines).
matplotlib is the optional `docs` extra, imported only here (as benchmarks/serve/plot.py does)."""
from __future__ import annotations

from pathlib import Path

from raypd.benchmarks.serve.plot import PlotUnavailable


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'raypd[docs]' (or pip install matplotlib)") \
            from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot(path: Path, report: dict, title: str) -> None:
    plt = _pyplot()
    fig, (ax_rss, ax_rel, ax_lat) = plt.subplots(3, 1, figsize=(12, 13), sharex=True)
    start, end = report["config"]["window_s"]
    series = report["samples"]["processes"]
    biggest = sorted(series, key=lambda k: -max(series[k]["rss_mib"] or [0]))
    cmap = plt.get_cmap("tab20")
    for i, label in enumerate(biggest):
        s = series[label]
        color = cmap(i % 20)
        ax_rss.plot(s["t_s"], s["rss_mib"], color=color, linewidth=1, label=label)
        base = report["processes"][label]["rss_mib_baseline"]
        if base:
            ax_rel.plot(s["t_s"], [100.0 * (v - base) / base for v in s["rss_mib"]], color=color, linewidth=1,
                        label=f"{label} ({report['rss_growth_pct'][label]:+.2f}%)")
    ax_rss.set_yscale("log")
    ax_rss.set_ylabel("RSS (MiB)")
    ax_rss.legend(fontsize=6, ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax_rel.axhline(report["config"]["thresholds"]["rss_limit_pct"], color="grey", linestyle="--", linewidth=1)
    ax_rel.set_ylabel("RSS vs the measured load's first sample (%)")
    ax_rel.legend(fontsize=6, ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5))
    done = [r for r in report["samples"]["requests"] if r[3] == "ok"]
    ax_lat.scatter([r[0] for r in done], [r[2] for r in done], s=3, alpha=0.3, color="tab:blue",
                   label="E2E per request")
    ax_lat.scatter([r[0] for r in done], [r[1] for r in done], s=3, alpha=0.3, color="tab:orange",
                   label="TTFT per request")
    minutes = [m for m in report["latency_per_minute"] if m["ok"]]
    mids = [m["start_s"] + 30.0 for m in minutes]
    for key, color, style in (("e2e_p50_s", "tab:blue", "-"), ("e2e_p99_s", "tab:blue", "--"),
                              ("ttft_p50_s", "tab:orange", "-"), ("ttft_p99_s", "tab:orange", "--")):
        ax_lat.plot(mids, [m[key] for m in minutes], color=color, linestyle=style, marker="o", markersize=3,
                    label=f"{key.removesuffix('_s').replace('_', ' ')} per minute")
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("latency (s)")
    ax_lat.set_xlabel("seconds since the load started")
    ax_lat.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    for ax in (ax_rss, ax_rel, ax_lat):
        ax.axvline(start, color="grey", linestyle=":", linewidth=1)  # the measured load, after warm-up and idle sample
        ax.axvline(end, color="grey", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
