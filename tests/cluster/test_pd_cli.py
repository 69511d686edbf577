"""`raypd generate --mode pd|mixed` as a user runs it: a subprocess that starts its own local Ray
cluster, node actors and (by default) the Conductor that routes each prompt, sends every prompt at
once, and prints JSON lines equal to transformers' greedy output. On the tiny random-weight model
(tests/tiny_model.py): what is checked is the CLI's modes end to end; the real model's parity across
nodes is that of the cluster test that compares with hf_reference (tests/tiny_model.py names it).

Every command of the module starts at once (the `launched` fixture), each its own process with its
own local Ray cluster, as users running them side by side would: most of a run is waiting on process
starts and Ray's daemons, so they overlap instead of queueing; each test then asserts on its own."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import NEW_TOKENS

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

MODES = {
    "pd-1+1": ("--mode", "pd", "--prefill-nodes", "1", "--decode-nodes", "1"),
    "pd-2+2": ("--mode", "pd", "--prefill-nodes", "2", "--decode-nodes", "2", "--cpus-per-node", "0.5"),
    "mixed-2-no-conductor": ("--mode", "mixed", "--mixed-nodes", "2", "--policy", "none"),  # the driver's round-robin
}
BAD = {
    "args0---mode pd needs": (("--prefill-nodes", "0"), "--mode pd needs"),
    "args1-unknown --policy 'random'": (("--policy", "random"), "unknown --policy 'random'"),
}


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory, prompt_ids):
    path = tmp_path_factory.mktemp("pd") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt_token_ids": ids}) + "\n" for ids in prompt_ids))
    return path


class Launched:
    """A `raypd generate` subprocess, its output going to files (no pipe fills while another runs)."""

    def __init__(self, folder: Path, name: str, cmd: list[str]):
        self.out, self.err = folder / f"{name}.out", folder / f"{name}.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)

    def finish(self, timeout_s: float) -> tuple[int, str, str]:
        try:
            self.proc.wait(timeout_s)
        finally:
            self.kill()
        return self.proc.returncode, self.out.read_text(), self.err.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def launched(tmp_path_factory, prompt_file, tiny_model_dir):
    folder = tmp_path_factory.mktemp("pd-cli")
    cli = [sys.executable, "-m", "raypd.cluster.cli.main", "generate"]
    runs = {name: Launched(folder, name, [*cli, "--json", "--max-tokens", str(NEW_TOKENS), "--input", str(prompt_file),
                                          "--model", tiny_model_dir, "--num-blocks", "512", *args])
            for name, args in MODES.items()}
    runs.update({name: Launched(folder, name, [*cli, "--mode", "pd", *args, "hello"]) for name, (args, _) in BAD.items()})
    try:
        yield runs
    finally:
        for run in runs.values():
            run.kill()


@pytest.mark.parametrize("mode", list(MODES))
def test_cluster_modes_match_reference(mode, launched, tiny_reference):
    code, out, err = launched[mode].finish(600)
    assert code == 0, err[-3000:]
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["token_ids"] for r in rows] == tiny_reference
    assert [r["finish_reason"] for r in rows] == \
        ["stop" if len(ref) < NEW_TOKENS else "length" for ref in tiny_reference]


@pytest.mark.parametrize("case", list(BAD))
def test_bad_cluster_arguments_fail_with_one_line(case, launched):
    code, _, err = launched[case].finish(120)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(f"raypd generate: error: {BAD[case][1]}")
