"""Draw a `raypd bench pd --json` result: per workload mix, the steady decoders' token latency (TPOT
p50/p99, ITL p99), the time to first token of both request kinds, and goodput, one bar per system.

    pip install -e '.[docs]'
    python -m benchmarks.plot_pd_vs_mixed docs/results/pd_vs_mixed.json docs/pd_vs_mixed.png

A result with several mixes (`--mix bursty,chat,long`) gives one PNG per mix, named after `out`
with the mix appended (docs/pd_adaptive.png -> docs/pd_adaptive_bursty.png, ...).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

LABELS = {"pd": ("PD: 1 prefill + 1 decode", "#2b6cb0"), "mixed": ("2 mixed nodes (replica fleet)", "#c05621"),
          "adaptive": ("adaptive: flex duties + split-or-local", "#2f855a"),
          "pd-local": ("PD + split-or-local", "#d69e2e"), "pd-srpt": ("PD, srpt admission", "#6b46c1"),
          "mixed-srpt": ("mixed, srpt admission", "#b7791f")}
TOKEN_LATENCY = (("decoder", "tpot_p50_ms", "TPOT p50"), ("decoder", "tpot_p99_ms", "TPOT p99"),
                 ("decoder", "itl_p99_ms", "ITL p99"))
FIRST_TOKEN = (("decoder", "ttft_p50_ms", "decoders\nTTFT p50"), ("decoder", "ttft_p99_ms", "decoders\nTTFT p99"),
               ("burst", "ttft_p50_ms", "long prompts\nTTFT p50"))
MIX_TITLES = {"bursty": "{decoders} steady decoders + every {burst_every:g} s {burst_size} x {burst_len}-token prompts",
              "chat": "{decoders} steady decoders ({decoder_len}-token prompts) only",
              "long": "every {burst_every:g} s {burst_size} x {burst_len}-token prompts only"}


def by_mix(report: dict) -> dict[str, dict[str, dict]]:
    """{mix: {system: result}}; results without a mix (older runs) are today's bursty workload."""
    out: dict[str, dict[str, dict]] = {}
    names = report["args"]["systems"].split(",")
    for i, r in enumerate(report["results"]):
        out.setdefault(r.get("mix", "bursty"), {})[r.get("system", names[i % len(names)])] = r
    return out


def bars(ax, results: dict[str, dict], metrics, unit_scale: float, unit: str, title: str) -> None:
    systems = list(results)
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        label, color = LABELS.get(system, (system, None))
        values = [(results[system].get(kind, {}).get(key) or 0.0) * unit_scale if kind else
                  (results[system].get(key) or 0.0) * unit_scale for kind, key, _ in metrics]
        xs = [x + (i - (len(systems) - 1) / 2) * width for x in range(len(metrics))]
        drawn = ax.bar(xs, values, width, label=label, color=color)
        ax.bar_label(drawn, fmt="%.0f" if unit == "ms" else "%.2f", fontsize=7)
    ax.set_xticks(range(len(metrics)), [name for _, _, name in metrics])
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)


def plot_mix(mix: str, results: dict[str, dict], report: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    args = report["args"]
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(14, 4), gridspec_kw={"width_ratios": [3, 3, 2]})
    bars(left, results, TOKEN_LATENCY, 1.0, "ms", "steady decoders' token latency (lower is better)")
    bars(mid, results, FIRST_TOKEN, 1e-3, "s", "time to first token (lower is better)")
    bars(right, results, (("", "goodput_rps", f"goodput\nTTFT<={args.get('slo_ttft', 0):g}s, "
                                                f"TPOT<={args.get('slo_tpot', 0):g}s"),
                          ("", "requests_per_s", "requests/s")), 1.0, "requests/s", "throughput (higher is better)")
    left.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{MIX_TITLES.get(mix, mix).format(**{'decoder_len': 64, **args})}; SmolLM2-135M, "
                 f"{report['machine']}, {args.get('cpus_per_node', 1):g} core per node", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot(report: dict, out: Path) -> list[Path]:
    mixes = by_mix(report)
    written = []
    for mix, results in mixes.items():
        path = out if len(mixes) == 1 else out.with_name(f"{out.stem}_{mix}{out.suffix}")
        plot_mix(mix, results, report, path)
        written.append(path)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path, help="JSON written by `raypd bench pd --json`")
    ap.add_argument("out", type=Path, help="PNG to write (one per mix, the mix appended, when there are several)")
    a = ap.parse_args()
    for path in plot(json.loads(a.result.read_text()), a.out):
        print(path)


if __name__ == "__main__":
    main()
