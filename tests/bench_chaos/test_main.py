"""The command line before anything starts: flags that make no run exit 2 with one line, and the
`raypd serve` command the bench would start."""
from __future__ import annotations

import pytest

from raypd.benchmarks.chaos.lab_mode import LabHost, LabRun
from raypd.benchmarks.chaos.main import build_parser, main, run_config, serve_command
from raypd.benchmarks.chaos.schedule import KillSchedule


@pytest.mark.parametrize("argv, message", [
    (["--targets", "gpu"], "targets must be some of"),
    (["--targets", "decode,host"], "need the lab (--lab)"),
    (["--targets", "partition"], "need the lab (--lab)"),
    (["--lab", "--partition-s", "0"], "--partition-s must be positive"),
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


def test_the_server_command_on_the_lab_joins_its_ray_and_places_by_role(tmp_path):
    lab = LabRun("198.18.0.10:6379", "198.18.0.10", (LabHost("h1", "prefill", 0, "198.18.0.11", "ns1"),), 5, 6)
    lab.write(tmp_path / "run.json")
    assert LabRun.read(tmp_path / "run.json") == lab
    flags = " ".join(serve_command(build_parser().parse_args(["--lab"]), 8123, lab)[4:])
    assert flags.startswith("--address 198.18.0.10:6379 --place-by-role --no-dashboard --host 127.0.0.1 --port 8123")
    argv = ["--lab", "--targets", "host", "--lab-run", str(tmp_path / "run.json")]
    config = run_config(build_parser().parse_args(argv), argv, ["python", "-m", "raypd", "serve"], tmp_path,
                        KillSchedule(60, 30, ["host"]))
    assert config["command"] == "raypd bench chaos --lab --targets host"
    assert [k["kind"] for k in config["planned_kills"]] == ["host_kill"]
