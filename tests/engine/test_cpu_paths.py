"""CPU kernel paths (engine/model/cpu_paths.py): which paths each CPU the project has met can run,
how a process is held to one, and the kernel tests once more on every lower path this CPU can run,
each in a process of its own (oneDNN and ATen read their caps once, before their first op). What
this CPU cannot run is named in the run's summary (tests/conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raypd.engine.model import cpu_paths, linear, native_build
from raypd.engine.model.cpu_paths import PATHS, UnknownCpuPath

pytestmark = pytest.mark.cluster  # starts a pytest process per path
PATH_TEST = "test_cpu_paths.py::test_the_kernel_tests_hold_on_each_path"
REPO = Path(__file__).resolve().parents[2]
# The tests that compare the CPU kernels with each other and with float64: tiny shapes, no model.
KERNEL_TESTS = ["tests/engine/test_native_decoder.py", "tests/engine/test_weight_formats.py",
                "tests/engine/test_cpu_kernels.py", "tests/engine/test_onednn_shapes.py"]
NEEDS_THE_MODEL = "not test_no_compiler and not test_native_is_an_error"  # these build engines on a model

V3 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi1 bmi2 f16c movbe popcnt abm"
V4 = V3 + " avx512f avx512bw avx512cd avx512dq avx512vl avx512_vnni"
CPUS = {  # the three development VMs, by the flags their /proc/cpuinfo showed
    "AVX2-only Zen": frozenset(V3.split()),
    "AVX-512 without AMX (Zen 4)": frozenset((V4 + " avx512_bf16").split()),
    "AVX-512 with AMX (Sapphire Rapids)": frozenset((V4 + " avx512_bf16 amx_tile amx_bf16 amx_int8").split()),
}


@pytest.mark.parametrize("cpu, expected", [
    ("AVX2-only Zen", ["portable", "avx2", "native"]),
    ("AVX-512 without AMX (Zen 4)", ["portable", "avx2", "avx512", "avx512-bf16", "native"]),
    ("AVX-512 with AMX (Sapphire Rapids)", ["portable", "avx2", "avx512", "avx512-bf16", "amx", "native"]),
])
def test_each_cpu_runs_the_paths_its_flags_allow(cpu, expected):
    assert [p.name for p in cpu_paths.runnable(CPUS[cpu], "x86_64")] == expected


def test_other_machines_run_only_the_native_build():
    assert [p.name for p in cpu_paths.runnable(frozenset({"asimd", "fp"}), "aarch64")] == ["native"]
    assert cpu_paths.missing(PATHS["avx2"], frozenset(), "aarch64") == ["an x86-64 CPU (this is aarch64)"]


def test_a_process_is_held_to_the_path_its_environment_names(monkeypatch):
    monkeypatch.setattr(cpu_paths, "cpu_flags", lambda: CPUS["AVX-512 without AMX (Zen 4)"])
    monkeypatch.setattr(cpu_paths.platform, "machine", lambda: "x86_64")
    monkeypatch.delenv(cpu_paths.ENV, raising=False)
    assert cpu_paths.held().name == "native"
    monkeypatch.setenv(cpu_paths.ENV, "avx2")
    assert cpu_paths.held().cflags == ("-march=x86-64-v3",)
    assert cpu_paths.environment(cpu_paths.held()) == {
        "RAYPD_CPU_PATH": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    assert not linear.bf16_matrix_units()  # below AVX512-BF16: bf16 weights stay on the C kernel
    monkeypatch.setenv(cpu_paths.ENV, "amx")
    with pytest.raises(UnknownCpuPath, match="lacks amx_bf16, amx_tile"):
        cpu_paths.held()
    monkeypatch.setenv(cpu_paths.ENV, "sse9")
    with pytest.raises(UnknownCpuPath, match="expected one of portable, avx2"):
        cpu_paths.held()


def test_each_path_builds_its_own_kernel(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYPD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(cpu_paths.ENV, "portable")
    native_build.load("paged_decode.c")
    monkeypatch.setenv(cpu_paths.ENV, "native")
    native_build.load("paged_decode.c")
    assert len(list((tmp_path / "kernels").glob("paged_decode-*.so"))) == 2  # one per target, never shared


@pytest.mark.parametrize("path", [p for p in PATHS if p != "native"])  # native: the suite's own run
def test_the_kernel_tests_hold_on_each_path(path):
    lacks = cpu_paths.missing(PATHS[path])
    if lacks:
        pytest.skip(f"this CPU cannot run the {path} path: it lacks {', '.join(lacks)}")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env.update(cpu_paths.environment(PATHS[path]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-k", NEEDS_THE_MODEL,
                           *KERNEL_TESTS], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    aten = PATHS[path].aten_capability
    assert aten is not None
    assert f"kernel path {path} " in out and f"ATen CPU capability: {aten.upper()}" in out, out[:2000]


def summarize(reports) -> list[str]:
    """The summary lines for test_the_kernel_tests_hold_on_each_path's reports (tests/conftest.py)."""
    ran, failed, not_here = [cpu_paths.held().name + " (the suite itself)", "torch (cpu_kernels='torch')"], [], []
    for r in reports:
        path = r.nodeid.partition("@")[0].rpartition("[")[2].rstrip("]")  # xdist may suffix "@group"
        if r.skipped:
            reason = r.longrepr[2] if isinstance(r.longrepr, tuple) else str(r.longrepr)
            not_here.append(f"{path} ({reason.rpartition('lacks ')[2]})")
        elif r.when == "call":
            (ran if r.passed else failed).append(path)
    lines = [cpu_paths.describe(), f"kernel paths exercised: {', '.join(ran)}"]
    if failed:
        lines.append(f"kernel paths that failed: {', '.join(failed)}")
    lines.append(f"not runnable on this CPU: {', '.join(not_here) or 'none'}")
    return lines

