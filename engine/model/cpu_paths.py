"""Which instruction-set path the CPU kernels take, and how a process is held to a lower one.

A CPU kernel's numbers depend on the instructions it runs: the C kernels (csrc/, built by
native_build.py) vectorize differently per target, oneDNN (the packed and bf16 projections) picks
its own kernels by ISA, and ATen's vectorized ops (norms, softmax, rotary) are dispatched by CPU
capability. The development and CI machines have been three different CPUs (AVX-512 + AMX, AVX2
only, AVX-512 without AMX), so a process can be held to any path its CPU can run, and the tests run
the kernel tests once per such path (tests/engine/test_cpu_paths.py):

    path         C kernels                        oneDNN cap          ATen        CPU flags it needs
    portable     -march=x86-64 (the plain C)      SSE41               default     (any x86-64)
    avx2         -march=x86-64-v3                 AVX2                avx2        avx2 fma bmi2 f16c
    avx512       -march=x86-64-v4                 AVX512_CORE         avx512      + avx512 f/bw/cd/dq/vl
    avx512-bf16  -march=x86-64-v4 -mavx512bf16    AVX512_CORE_BF16    avx512      + avx512_bf16
    amx          -march=x86-64-v4 -mavx512bf16    AVX512_CORE_AMX     avx512      + amx_tile amx_bf16
    native       -march=native                    (none)              (none)      (the default: all it has)

The C kernels use no AMX instruction, so amx differs from avx512-bf16 only in oneDNN. Without
C kernels at all the engine takes the torch path (cpu_kernels="torch", or no compiler): that one
needs no hardware and every run tests it. RAYPD_CPU_PATH holds a process to a path; oneDNN and
ATen read their caps once, before their first op, so a process is started on a path with
environment(path) (RAYPD_CPU_PATH alone moves only the C kernels and the row-split choice).
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ENV = "RAYPD_CPU_PATH"
V3 = frozenset({"avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"})
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@dataclass(frozen=True, slots=True)
class CpuPath:
    name: str
    cflags: tuple[str, ...]      # the C kernels' target flags (native_build.py adds -O3 and the rest)
    onednn_isa: str | None       # ONEDNN_MAX_CPU_ISA; None: uncapped
    aten_capability: str | None  # ATEN_CPU_CAPABILITY; None: uncapped
    needs: frozenset[str]        # /proc/cpuinfo flags the path's instructions use
    bf16_matrix_units: bool      # oneDNN may multiply bf16 in hardware (AVX512-BF16 or AMX)

    @property
    def x86_only(self) -> bool:
        return self.name != "native"


PATHS: dict[str, CpuPath] = {p.name: p for p in (
    CpuPath("portable", ("-march=x86-64",), "SSE41", "default", frozenset(), False),
    CpuPath("avx2", ("-march=x86-64-v3",), "AVX2", "avx2", V3, False),
    CpuPath("avx512", ("-march=x86-64-v4",), "AVX512_CORE", "avx512", V4, False),
    CpuPath("avx512-bf16", ("-march=x86-64-v4", "-mavx512bf16"), "AVX512_CORE_BF16", "avx512",
            V4 | {"avx512_bf16"}, True),
    CpuPath("amx", ("-march=x86-64-v4", "-mavx512bf16"), "AVX512_CORE_AMX", "avx512",
            V4 | {"avx512_bf16", "amx_tile", "amx_bf16"}, True),
    CpuPath("native", ("-march=native",), None, None, frozenset(), True),
)}


class UnknownCpuPath(ValueError):
    """RAYPD_CPU_PATH names no path, or one this CPU cannot run."""


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo names them (empty where there is no such file)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def missing(path: CpuPath, flags: frozenset[str] | None = None, machine: str | None = None) -> list[str]:
    """What this CPU (or the given flags and machine) lacks to run `path`; empty when it can."""
    machine = machine or platform.machine()
    if path.x86_only and machine not in ("x86_64", "AMD64"):
        return [f"an x86-64 CPU (this is {machine})"]
    have = cpu_flags() if flags is None else flags
    return sorted(path.needs - have)


def runnable(flags: frozenset[str] | None = None, machine: str | None = None) -> list[CpuPath]:
    """Every path this CPU can run, lowest first (native last)."""
    return [p for p in PATHS.values() if not missing(p, flags, machine)]


def held() -> CpuPath:
    """The path this process is held to (RAYPD_CPU_PATH; native when unset)."""
    name = os.environ.get(ENV, "native") or "native"
    if name not in PATHS:
        raise UnknownCpuPath(f"{ENV}={name!r}: expected one of {', '.join(PATHS)}")
    lacks = missing(PATHS[name])
    if lacks:
        raise UnknownCpuPath(f"{ENV}={name!r}: this CPU lacks {', '.join(lacks)}")
    return PATHS[name]


def environment(path: CpuPath) -> dict[str, str]:
    """The variables that start a process on `path`: the C kernels, oneDNN and ATen all held to it."""
    env = {ENV: path.name}
    if path.onednn_isa is not None:
        env["ONEDNN_MAX_CPU_ISA"] = path.onednn_isa
    if path.aten_capability is not None:
        env["ATEN_CPU_CAPABILITY"] = path.aten_capability
    return env


def describe() -> str:
    """One line for logs and test headers: the CPU, its vector features and the path taken."""
    vector = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma")))
    path = held()
    caps = ", ".join(f"{k}={v}" for k, v in environment(path).items() if k != ENV) or "oneDNN and ATen uncapped"
    return (f"{platform.machine()} CPU with {' '.join(vector) or 'no AVX'}; kernel path {path.name} "
            f"(C {' '.join(path.cflags)}; {caps})")
