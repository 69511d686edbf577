"""The command line before anything starts: flags that make no run exit 2 with one line; the
default warm-up; the `raypd serve` command the bench would start; `raypd bench soak` is registered."""
from __future__ import annotations

import pytest

from raypd.benchmarks.soak.main import build_parser, check_args, main, serve_command
from raypd.cluster.cli.bench import BENCHMARKS


@pytest.mark.parametrize("argv, message", [
    (["--duration", "0"], "must be positive"),
    (["--load", "0"], "--load in (0, 1.5]"),
    (["--decode-nodes", "0"], "must be >= 1"),
    (["--tail-samples", "0"], "must be >= 1"),
    (["--min-tokens", "50", "--max-tokens", "40"], "--min-tokens"),
    (["--duration", "60", "--warmup", "55"], "--warmup must leave"),
])
def test_flags_that_make_no_run_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("raypd bench soak: error:") and message in err


def test_the_default_warmup_is_a_fifth_of_the_run_at_most_two_minutes():
    for duration, warmup in ((60, 12.0), (600, 120.0), (3600, 120.0)):
        args = build_parser().parse_args(["--duration", str(duration)])
        check_args(args)
        assert args.warmup == warmup


def test_the_server_command_and_the_registration():
    args = build_parser().parse_args(["--prefill-nodes", "2", "--serve-args", "--policy round_robin"])
    cmd = serve_command(args, 8123)
    assert cmd[1:4] == ["-m", "raypd", "serve"]
    flags = " ".join(cmd[4:])
    assert "--host 127.0.0.1 --port 8123" in flags and "--prefill-nodes 2 --decode-nodes 1" in flags
    assert flags.endswith("--policy round_robin")
    assert BENCHMARKS["soak"] == "raypd.benchmarks.soak.main"
