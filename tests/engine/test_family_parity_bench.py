"""`raypd bench parity` (benchmarks/family_parity.py) on the CPU: every family's tiny checkpoint
through the Triton kernels (Triton's interpreter here; compiled on a GPU) gives transformers' float32
greedy tokens, cold and from the prefix cache. The same command is the GPU check."""
from __future__ import annotations

import json

import pytest

from raypd.benchmarks import family_parity
from raypd.engine.model.source import resolve_model


@pytest.fixture(autouse=True)
def few_decode_splits(monkeypatch):
    """Split decode attention as for a GPU of 4 SMs: Triton's interpreter runs every program in
    Python, and the splits a 132-SM GPU would get only multiply them (the kernel tests cover splits)."""
    from raypd.engine.gpu import paged_attention
    monkeypatch.setattr(paged_attention, "_DEFAULT_SMS", 4)


def test_every_family_on_the_triton_kernels_equals_transformers(tmp_path):
    out = tmp_path / "parity.json"
    code = family_parity.main(["--device", "cpu", "--attention-backend", "triton", "--max-tokens", "4",
                               "--tokenizer", str(resolve_model(None)), "--json", str(out)])
    report = json.loads(out.read_text())
    assert set(report["results"]) == {"llama", "qwen2", "qwen3", "llama3"}
    assert {name: r["float32_identical"] for name, r in report["results"].items()} == dict.fromkeys(report["results"], True)
    assert code == 0 and report["passed"]
