"""The run's picture (benchmarks/autoscale/plot.py) from a report: a PNG is written, also for a run
whose /health had no autoscale key and whose step never recovered."""
from __future__ import annotations

from raypd.benchmarks.autoscale.plot import plot
from tests.bench_autoscale.report_fixture import report

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_plot_is_a_png(tmp_path):
    path = tmp_path / "figs" / "autoscale.png"
    plot(path, report(set(range(20, 40))), "raypd bench autoscale: test")
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000


def test_a_run_without_the_autoscale_key_and_without_recovery_plots_too(tmp_path):
    r = report(set(range(20, 60)), lost={90})
    for s in r["health"]["samples"]:
        s.pop("autoscale", None)
    path = tmp_path / "plain.png"
    plot(path, r, "no autoscale key")
    assert path.read_bytes()[:8] == PNG
