"""The command line before anything starts: flags that make no run exit 2 with one line, and the
`raypd serve` command the bench would start."""
from __future__ import annotations

import pytest

from raypd.benchmarks.chaos.main import build_parser, main, serve_command


@pytest.mark.parametrize("argv, message", [
    (["--targets", "gpu"], "targets must be some of"),
    (["--duration", "0"], "must be positive"),
    (["--decode-nodes", "0"], "must be positive"),
    (["--kill-every", "0"], "--kill-every must be > 0"),
    (["--min-tokens", "50", "--max-tokens", "40"], "--min-tokens"),
    (["--num-requests", "0"], "at least one request"),
])
def test_flags_that_make_no_run_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("raypd bench chaos: error:") and message in err


def test_the_server_command():
    args = build_parser().parse_args(["--prefill-nodes", "2", "--decode-nodes", "3", "--serve-args", "--policy cost"])
    cmd = serve_command(args, 8123)
    assert cmd[1:4] == ["-m", "raypd", "serve"]
    flags = " ".join(cmd[4:])
    assert "--host 127.0.0.1 --port 8123" in flags and "--prefill-nodes 2 --decode-nodes 3" in flags
    assert "--max-node-restarts 1000" in flags and flags.endswith("--policy cost")
    assert "--chaos-hooks" in flags  # its engine_crash kills need the nodes' crash_engine()
    args = build_parser().parse_args(["--max-node-restarts", "-1"])
    assert "--max-node-restarts" not in serve_command(args, 1)
