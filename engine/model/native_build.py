"""Compile a C kernel from csrc/ on first use, into the cache folder, and load it with ctypes.

The kernels are plain C (no torch headers), so a build takes about a second with the system
compiler. The target flags are the process's CPU path (cpu_paths.py: -march=native unless the
process is held to a lower path). A library is built once per sources, flags and CPU (-march=native
code is only valid on the kind of CPU that built it, and the cache folder may be shared); nodes starting together may
all build at once, so each builds beside the target and renames. -fopenmp links the libgomp.so.1
torch has already loaded: the kernels' parallel regions run on torch's own worker threads instead
of competing with them while they spin after a matmul (docs/benchmarks.md).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from raypd.engine.model import cpu_paths
from raypd.engine.model.source import cache_root

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
CFLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")  # then the CPU path's target flags


class KernelUnavailable(RuntimeError):
    """A native kernel cannot be built or loaded here (no compiler, unsupported platform...)."""


def load(source_name: str, extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """csrc/<source_name> built with CFLAGS, the CPU path's flags and extra_flags, and loaded;
    KernelUnavailable if it cannot be. Callers cache the result and declare the argument types of
    what they call."""
    if platform.system() not in ("Linux", "Darwin"):
        raise KernelUnavailable(f"no native kernel build on {platform.system()}")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise KernelUnavailable("no C compiler (cc, gcc or clang) on PATH")
    source = CSRC / source_name
    flags = [*CFLAGS, *cpu_paths.held().cflags, *extra_flags]
    # Every file of csrc/ goes into the key: a source may #include the others.
    sources = b"".join(p.name.encode() + p.read_bytes() for p in sorted(CSRC.iterdir()) if p.suffix in (".c", ".h"))
    key = hashlib.sha256(source.name.encode() + sources + " ".join(flags).encode()
                         + _cpu_fingerprint().encode()).hexdigest()[:16]
    target = cache_root() / "kernels" / f"{source.stem}-{key}.so"
    if not target.exists():
        _build(compiler, source, flags, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        raise KernelUnavailable(f"cannot load {target}: {e}") from e


def _build(compiler: str, source: Path, flags: list[str], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [compiler, *flags, "-o", tmp, str(source), "-lm"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise KernelUnavailable(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise KernelUnavailable(f"cannot build {source.name}: {e}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("built the native kernel %s: %s", source.name, target)


def _cpu_fingerprint() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    wanted = [ln for ln in lines if ln.startswith(("model name", "flags"))][:2]
    return platform.machine() + "\n".join(wanted)
