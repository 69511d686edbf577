"""`raypd bench autoscale`'s command line (benchmarks/autoscale/main.py, server.py): registered with
`raypd bench`, the durations' full-run and --short defaults, flags that make no run refused with
status 2 before anything starts, the servers' commands (calibration, autoscaling, the fixed control),
and a signal during the event loop ends the run after its clean-up."""
from __future__ import annotations

import pytest

from raypd.benchmarks.autoscale import main as autoscale_main
from raypd.benchmarks.autoscale.server import PoolSpec, serve_command
from raypd.cluster.cli.bench import BENCHMARKS


def test_it_is_a_raypd_bench():
    assert BENCHMARKS["autoscale"] == "raypd.benchmarks.autoscale.main"


def parsed(*argv: str):
    args = autoscale_main.build_parser().parse_args(list(argv))
    autoscale_main.resolve(args)
    return args


def test_durations_default_to_a_full_run_or_to_seconds_with_short():
    full, short = parsed(), parsed("--short")
    assert (full.warm, full.step, full.cool, full.bucket) == (60.0, 120.0, 240.0, 10.0)
    assert (short.warm, short.step, short.cool) == (3.0, 6.0, 6.0)
    assert parsed("--short", "--step", "9").step == 9.0                      # a flag given wins
    assert parsed("--json", "x.json").out.name == "x.json"                   # --json is --out


@pytest.mark.parametrize("argv, message", [
    (["--warm", "0"], "--warm"),
    (["--base-rate", "-1"], "--base-rate"),
    (["--base-rate", "1", "--step-factor", "1"], "--step-factor"),
    (["--attainment", "1.5"], "--attainment"),
    (["--nodes", "3:1"], "--nodes"),
    (["--nodes", "two"], "--nodes"),
    (["--max-inflight", "0"], "--max-inflight"),
    (["--no-autoscale"], "--no-autoscale needs --base-rate"),
    (["--serve-args", "--model X --mixed-nodes 2"], "must not set --mixed-nodes"),
    (["--serve-args=--autoscale=1:2"], "must not set --autoscale"),
    (["--base-rate", "200", "--step", "600"], "at most"),
])
def test_flags_that_make_no_run_exit_2_before_anything_starts(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(autoscale_main.server, "started", lambda *a, **k: pytest.fail("must not get this far"))
    assert autoscale_main.main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_servers_commands():
    pool = PoolSpec(least=1, most=3, ttft_s=2.0, tpot_s=0.25)
    scaled = serve_command(18000, pool, "--model /m --kv-cache-memory 64")
    assert scaled[1:4] == ["-m", "raypd", "serve"] and scaled[scaled.index("--host") + 1] == "127.0.0.1"
    assert scaled[scaled.index("--port") + 1] == "18000"
    flags = scaled[scaled.index("--mixed-nodes"):]
    assert flags == ["--mixed-nodes", "1", "--autoscale", "mixed=1:3", "--autoscale-ttft", "2", "--autoscale-tpot",
                     "0.25", "--model", "/m", "--kv-cache-memory", "64"]
    calibration = serve_command(18000, pool, "--model /m", calibration=True)
    assert calibration[calibration.index("--mixed-nodes"):] == ["--mixed-nodes", "1", "--model", "/m"]
    fixed = serve_command(18000, PoolSpec(2, 3, 2.0, 0.25, autoscale=False), "")
    assert fixed[fixed.index("--mixed-nodes"):] == ["--mixed-nodes", "2"]
    tuned = serve_command(18000, PoolSpec(1, 3, 1.0, 0.1, window_s=20.0, attainment=0.95), "")
    assert tuned[tuned.index("--autoscale-tpot") + 2:] == ["--autoscale-attainment", "0.95", "--autoscale-window", "20"]


def test_the_pool_comes_from_the_flags():
    pool = autoscale_main.pool_spec(parsed("--nodes", "2:4", "--slo-ttft", "1.5", "--autoscale-window", "15"))
    assert pool == PoolSpec(2, 4, 1.5, 0.25, 15.0, True, 0.9)
    assert not autoscale_main.pool_spec(parsed("--no-autoscale", "--base-rate", "1")).autoscale
