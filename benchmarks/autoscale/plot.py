"""The run's picture, from its JSON report: the top panel is the node pool per role over time as
/health said (live solid, draining dashed, starting dotted where the autoscale key counts it); the
bottom panel is each bucket's SLO attainment (bars, orange below the target, the target as a line) and the offered rate (a
second axis); the phase boundaries are marked on both. matplotlib is the optional `docs` extra,
imported only here (as benchmarks/serve/plot.py does)."""
from __future__ import annotations

from pathlib import Path

from raypd.benchmarks.autoscale.health import HealthSample
from raypd.benchmarks.serve.plot import PlotUnavailable


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("the plot needs matplotlib: pip install 'raypd[docs]' (or pip install matplotlib)") \
            from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot(path: Path, report: dict, title: str) -> None:
    plt = _pyplot()
    fig, (ax_nodes, ax_att) = plt.subplots(2, 1, figsize=(12, 7), sharex=True, height_ratios=(2, 3))
    samples = [HealthSample(s["t_s"], s["http"], s["status"], s["roles"], s.get("autoscale"))
               for s in report["health"]["samples"]]
    t = [s.t_s for s in samples]
    roles = sorted({role for s in samples for role in s.roles})
    cmap = plt.get_cmap("tab10")
    top = 1
    for i, role in enumerate(roles):
        color = cmap(i % 10)
        live = [s.count(role, "live") for s in samples]
        draining = [s.count(role, "draining") for s in samples]
        ax_nodes.step(t, live, where="post", color=color, linewidth=2, label=f"{role} live")
        ax_nodes.step(t, draining, where="post", color=color, linestyle="--", linewidth=1.5, label=f"{role} draining")
        starting = [s.starting(role) for s in samples]
        if any(starting):
            ax_nodes.step(t, starting, where="post", color=color, linestyle=":", linewidth=1.5,
                          label=f"{role} starting")
        top = max(top, *live, *starting, 1)
    ax_nodes.set_ylim(-0.2, top + 0.4)
    ax_nodes.set_yticks(range(0, top + 1))
    ax_nodes.set_ylabel("nodes")
    ax_nodes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.07, 1.0))

    timeline = report["timeline"]
    rated = [b for b in timeline if b["attainment"] is not None]
    target = report["config"]["slo"]["attainment"]
    ax_att.bar([b["start_s"] for b in rated], [b["attainment"] for b in rated],
               width=[b["end_s"] - b["start_s"] for b in rated], align="edge", alpha=0.6, edgecolor="white",
               color=["tab:green" if b["attainment"] >= target else "tab:orange" for b in rated],
               label="SLO attainment per bucket\n(orange: below the target)")
    ax_att.axhline(target, color="tab:red", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax_att.set_ylim(0, 1.05)
    ax_att.set_ylabel("SLO attainment (by arrival)")
    ax_att.set_xlabel("seconds since the load began")
    ax_rate = ax_att.twinx()
    if timeline:
        ax_rate.step([b["start_s"] for b in timeline] + [timeline[-1]["end_s"]],
                     [b["offered_rps"] for b in timeline] + [timeline[-1]["offered_rps"]], where="post",
                     color="tab:blue", linewidth=1.5, label="offered rate")
    ax_rate.set_ylabel("offered (req/s)")
    ax_rate.set_ylim(bottom=0)
    handles = ax_att.get_legend_handles_labels()
    more = ax_rate.get_legend_handles_labels()
    ax_att.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8, loc="upper left", bbox_to_anchor=(1.07, 1.0))

    for p in report["plan"]:
        for ax in (ax_nodes, ax_att):
            ax.axvline(p["start_s"], color="grey", linestyle=":", linewidth=1)
        ax_nodes.text(p["start_s"], 1.01, f" {p['name']}\n {p['rate']:.2g}/s", fontsize=8, va="bottom",
                      transform=ax_nodes.get_xaxis_transform())
    rec = report["recovery"]
    if rec.get("recovered_at_s") is not None and rec.get("dipped"):
        ax_att.axvline(rec["recovered_at_s"], color="tab:red", linewidth=1)
        ax_att.text(rec["recovered_at_s"] + 1, 0.05, f"recovered +{rec['recovery_s']:.0f} s", color="tab:red",
                    fontsize=8)
    for ax in (ax_nodes, ax_att):
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)

