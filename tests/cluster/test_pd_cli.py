"""`raypd generate --mode pd|mixed` as a user runs it: a subprocess that starts its own local Ray
cluster, node actors and (by default) the Conductor that routes each prompt, sends every prompt at
once, and prints JSON lines equal to transformers' greedy output. On the tiny random-weight model
(tests/tiny_model.py): what is checked is the CLI's modes end to end; the real model's parity across
nodes is that of the cluster test that compares with hf_reference (tests/tiny_model.py names it)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import NEW_TOKENS

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory, prompt_ids):
    path = tmp_path_factory.mktemp("pd") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt_token_ids": ids}) + "\n" for ids in prompt_ids))
    return path


def run_cli(*args: str) -> list[dict]:
    cmd = [sys.executable, "-m", "raypd.cluster.cli.main", "generate", "--json", "--max-tokens", str(NEW_TOKENS), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("args", [
    ("--mode", "pd", "--prefill-nodes", "1", "--decode-nodes", "1"),
    ("--mode", "pd", "--prefill-nodes", "2", "--decode-nodes", "2", "--cpus-per-node", "0.5"),
    ("--mode", "mixed", "--mixed-nodes", "2", "--policy", "none"),   # no Conductor: the driver's round-robin
], ids=["pd-1+1", "pd-2+2", "mixed-2-no-conductor"])
def test_cluster_modes_match_reference(args, prompt_file, tiny_model_dir, tiny_reference):
    rows = run_cli("--input", str(prompt_file), "--model", tiny_model_dir, "--num-blocks", "512", *args)
    assert [r["token_ids"] for r in rows] == tiny_reference
    assert [r["finish_reason"] for r in rows] == \
        ["stop" if len(ref) < NEW_TOKENS else "length" for ref in tiny_reference]


@pytest.mark.parametrize("args, message", [
    (("--prefill-nodes", "0"), "--mode pd needs"),
    (("--policy", "random"), "unknown --policy 'random'"),
])
def test_bad_cluster_arguments_fail_with_one_line(args, message):
    proc = subprocess.run([sys.executable, "-m", "raypd.cluster.cli.main", "generate", "--mode", "pd", *args, "hello"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"raypd generate: error: {message}")
