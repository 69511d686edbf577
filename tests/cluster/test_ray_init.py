"""Starting Ray: a stale `ray_current_cluster` file (a `ray start` cluster that died without `ray stop`)
does not make raypd join a dead cluster; it starts its own unless told to join one (--address or
RAY_ADDRESS, which Ray then waits on: not tried here). Run in a child process with its own Ray temp folder, so nothing here touches this
machine's Ray or the test process's."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

STALE = "127.0.0.1:1"  # the recorded address of a cluster that is gone
CHILD = """
import ray
from raypd.cluster.launch.ray_init import init_ray
started = init_ray(None, 1, local_options={"include_dashboard": False}, log_to_driver=False).started
try:
    print("started", started, ray.get_runtime_context().gcs_address)
finally:
    ray.shutdown()
"""


def run_child(temp: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=180,
                          env={**clean, "RAY_TMPDIR": str(temp), **env})


def test_a_stale_recorded_cluster_is_not_joined():
    # A short folder: Ray's socket paths under it must stay within the 107 bytes a Unix socket allows.
    with tempfile.TemporaryDirectory(prefix="rpd") as temp:
        (Path(temp) / "ray").mkdir()
        (Path(temp) / "ray" / "ray_current_cluster").write_text(STALE)
        child = run_child(Path(temp))
    assert child.returncode == 0, child.stderr[-3000:]
    started = child.stdout.split()
    assert started[:2] == ["started", "True"] and started[2] != STALE

