"""`raypd generate` as a user runs it: a subprocess, JSON lines out, clear errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import NEW_TOKENS
from tests.prompts import CHAT_PROMPTS, RAW_PROMPTS

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes


def raypd(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raypd.cluster.cli.main", *args], capture_output=True, text=True, timeout=timeout)


def test_generate_json_matches_transformers(tmp_path, tiny_model_dir, tiny_reference):
    # On the tiny model (tests/tiny_model.py, the default model's tokenizer and chat template): what
    # is checked is the command's path from prompts and messages to tokens, not the weights (those
    # are tests/engine/test_parity.py's).
    lines = [{"prompt": p} for p in RAW_PROMPTS] + [{"messages": m} for m in CHAT_PROMPTS]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    r = raypd("generate", "--model", tiny_model_dir, "--input", str(path), "--json", "--max-tokens", str(NEW_TOKENS),
              "--temperature", "0")
    assert r.returncode == 0, r.stderr
    results = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["token_ids"] for x in results] == tiny_reference
    for x in results:
        assert set(x) == {"token_ids", "text", "finish_reason", "num_cached_tokens"}
        assert x["finish_reason"] in ("stop", "length")


def test_generate_reports_bad_input_in_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nope": 1}\n')
    for args, words in [(["--input", str(bad)], "bad.jsonl:2"), (["--max-tokens", "0", "hi"], "max_tokens"),
                        (["--model", str(tmp_path / "missing"), "hi"], "does not exist"), ([], "no prompts"),
                        (["--input", str(tmp_path / "absent.jsonl")], "cannot read")]:
        r = raypd("generate", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert words in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
