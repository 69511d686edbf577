"""What each kind of raypd process imports at start, in a fresh interpreter: the node pool (a Serve
replica of the control plane) imports no torch, and a node's engine no transformers (it sees token
ids only; the tokenizer belongs to the ingress and to the offline LLM). Each costs every start of
that process ~1.5-3.7 CPU-s and ~200 MB, and a serving cluster starts them often (restarts, scaling)."""
from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> None:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok"), out.stdout


def test_the_node_pool_and_the_transfer_package_import_no_torch():
    _run("import sys, raypd.cluster.serve.node_pool, raypd.kvtransfer; "
         "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")


def test_a_node_engine_loads_without_transformers(tiny_model_dir):
    _run(f"import sys; from raypd.engine.engine import LLMEngine; LLMEngine({tiny_model_dir!r}, num_blocks=8); "
         "assert 'transformers' not in sys.modules, 'transformers imported'; print('ok')")
