"""Draw the README's picture from a `raypd bench pd --json` result: the steady decoders' token latency
(TPOT p50/p99, ITL p99) and the time to first token of both request kinds, PD against mixed nodes.

    pip install -e '.[docs]'
    python -m benchmarks.plot_pd_vs_mixed docs/results/pd_vs_mixed.json docs/pd_vs_mixed.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

SYSTEMS = (("pd", "PD: 1 prefill + 1 decode", "#2b6cb0"), ("mixed", "2 mixed nodes (replica fleet)", "#c05621"))
TOKEN_LATENCY = (("decoder", "tpot_p50_ms", "TPOT p50"), ("decoder", "tpot_p99_ms", "TPOT p99"),
                 ("decoder", "itl_p99_ms", "ITL p99"))
FIRST_TOKEN = (("decoder", "ttft_p50_ms", "decoders\nTTFT p50"), ("burst", "ttft_p50_ms", "long prompts\nTTFT p50"))


def by_system(report: dict) -> dict[str, dict]:
    """The run's result per system name; the JSON lists results in the order of args.systems."""
    names = report["args"]["systems"].split(",")
    return dict(zip(names, report["results"], strict=True))


def bars(ax, results: dict[str, dict], metrics, unit_scale: float, unit: str, title: str) -> None:
    width = 0.38
    for i, (system, label, color) in enumerate(SYSTEMS):
        values = [results[system][kind][key] * unit_scale for kind, key, _ in metrics]
        xs = [x + (i - 0.5) * width for x in range(len(metrics))]
        drawn = ax.bar(xs, values, width, label=label, color=color)
        ax.bar_label(drawn, fmt="%.0f" if unit == "ms" else "%.1f", fontsize=8)
    ax.set_xticks(range(len(metrics)), [name for _, _, name in metrics])
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)


def plot(report: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    results = by_system(report)
    args = report["args"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 2]})
    bars(left, results, TOKEN_LATENCY, 1.0, "ms", "steady decoders' token latency (lower is better)")
    bars(right, results, FIRST_TOKEN, 1e-3, "s", "time to first token")
    left.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{args['decoders']} steady decoders + every {args['burst_every']:.0f} s a burst of "
                 f"{args['burst_size']} x {args['burst_len']}-token prompts; SmolLM2-135M, "
                 f"{report['machine']}, 1 core per node", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path, help="JSON written by `raypd bench pd --json`")
    ap.add_argument("out", type=Path, help="PNG to write")
    a = ap.parse_args()
    plot(json.loads(a.result.read_text()), a.out)


if __name__ == "__main__":
    main()
