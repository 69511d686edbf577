"""The suite's tiers stay what `make test` (tests/run_suite.py) assumes of them: the `compute` tests,
run at the lowest CPU priority beside the cluster tests, only compute in their own process - their
files import nothing that runs beside the test or waits on the clock, so a test starved of CPU for a
while only takes longer."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import COMPUTE_DIR, compute_only

ROOT = Path(__file__).resolve().parents[1]
# Modules whose use means a thread, a process, a socket or a wall-clock wait in the test.
RUNS_BESIDE = {"threading", "subprocess", "asyncio", "socket", "multiprocessing", "concurrent", "time", "signal",
               "zmq", "ray", "raypd.node", "raypd.prefill_node", "raypd.decode_node", "raypd.flex_node",
               "raypd.kvtransfer", "raypd.conductor", "raypd.cluster.serve", "raypd.cluster.launch", "raypd.cluster.client"}


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def marked_cluster(path: Path) -> bool:
    return "pytestmark = pytest.mark.cluster" in path.read_text()


def compute_files() -> list[Path]:
    folder = ROOT / COMPUTE_DIR
    return [p for p in sorted(folder.glob("*.py"))
            if compute_only(p.relative_to(ROOT).as_posix()) and not marked_cluster(p)]


def runs_beside(path: Path) -> list[str]:
    return sorted(name for name in imported(path) if any(name == m or name.startswith(m + ".") for m in RUNS_BESIDE))


@pytest.mark.parametrize("path", compute_files(), ids=lambda p: p.name)
def test_a_compute_file_imports_nothing_that_runs_beside_the_test(path):
    assert not (bad := runs_beside(path)), \
        f"{path.name} imports {bad}: list it in tests/conftest.py NOT_COMPUTE, or mark it cluster"


def test_the_check_finds_a_planted_thread_and_node(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text("import os\nimport threading\nfrom raypd.node.engine_loop import EngineLoop\n"
                       "from raypd.engine import LLM\n")
    assert runs_beside(planted) == ["raypd.node.engine_loop", "threading"]
