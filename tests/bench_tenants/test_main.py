"""`raypd bench tenants`'s command line (benchmarks/tenants/main.py, server.py): registered with
`raypd bench`, flags that make no run refused with status 2 before anything starts, and the two
servers' commands: the same flags, the second with --no-tenant-fairness; a signal during a run's
event loop stops the run after its clean-up."""
from __future__ import annotations

import pytest

from raypd.benchmarks.tenants import main as tenants_main
from raypd.benchmarks.tenants.server import serve_command
from raypd.cluster.cli.bench import BENCHMARKS


def test_it_is_a_raypd_bench():
    assert BENCHMARKS["tenants"] == "raypd.benchmarks.tenants.main"


@pytest.mark.parametrize("argv, message", [
    (["--phase-duration", "0"], "--phase-duration"),
    (["--capacity", "-1"], "--capacity"),
    (["--b-load", "0"], "--b-load"),
    (["--max-inflight", "0"], "--max-inflight"),
    (["--phase-duration", "5", "--flood-lead", "5"], "--flood-lead"),
    (["--serve-args", "--model X --no-tenant-fairness"], "must not turn fairness off"),
])
def test_flags_that_make_no_run_exit_2_before_anything_starts(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(tenants_main, "text_source", lambda: pytest.fail("must not get this far"))
    assert tenants_main.main(argv) == 2
    assert message in capsys.readouterr().err


def test_both_servers_get_the_same_flags_and_only_the_second_turns_fairness_off():
    fair = serve_command(18000, True, "--model /m --kv-cache-memory 64")
    unfair = serve_command(18001, False, "--model /m --kv-cache-memory 64")
    assert fair[1:4] == ["-m", "raypd", "serve"] and "--no-tenant-fairness" not in fair
    assert unfair[-1] == "--no-tenant-fairness"
    assert [a for a in unfair[:-1] if a not in ("18000", "18001")] == [a for a in fair if a not in ("18000", "18001")]
    assert fair[fair.index("--host") + 1] == "127.0.0.1"
