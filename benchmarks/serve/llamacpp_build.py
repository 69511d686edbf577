"""Find or build llama.cpp's `llama-server`, from the package registry only.

    pip download --no-deps --no-binary=:all: llama-cpp-python    (its sdist vendors llama.cpp)
    -> <cache>/llama.cpp/<version>-<isa>/src/vendor/llama.cpp
    -> cmake -DGGML_NATIVE=OFF + this CPU's ISA flags -> cmake --build --target llama-server -j<jobs>
    -> <cache>/llama.cpp/<version>-<isa>/build/bin/llama-server

<cache> is $RAYPD_CACHE_DIR or ~/.cache/raypd (outside the repository). ISA flags: AVX, AVX2, FMA,
F16C and the AVX-512 family exactly as /proc/cpuinfo lists them, never AMX (llama.cpp's AMX kernel
segfaulted on the first request on a VM that reported AMX), and GGML_NATIVE off so that
`-march=native` cannot turn AMX back on. A build takes about 10 minutes on 2 cores.
"""
from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from raypd.engine.model.cpu_paths import cpu_flags
from raypd.engine.model.source import cache_root

PACKAGE = "llama-cpp-python"
# ggml's CMake option -> the /proc/cpuinfo flag that allows it.
ISA_OPTIONS = {"GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_FMA": "fma", "GGML_F16C": "f16c",
               "GGML_AVX512": "avx512f", "GGML_AVX512_VBMI": "avx512vbmi", "GGML_AVX512_VNNI": "avx512_vnni",
               "GGML_AVX512_BF16": "avx512_bf16"}
NEVER = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


class BuildError(RuntimeError):
    """llama-server could not be found or built; the message says which step failed."""


def isa_options(flags: frozenset[str] | set[str]) -> tuple[str, dict[str, bool]]:
    """(cache tag, CMake options): every ISA option ON exactly when the CPU has it; AMX always OFF."""
    opts = {opt: flag in flags for opt, flag in ISA_OPTIONS.items()} | dict.fromkeys(NEVER, False)
    tag = "avx512" if opts["GGML_AVX512"] else "avx2" if opts["GGML_AVX2"] else "avx" if opts["GGML_AVX"] else "generic"
    return tag, opts


def cache_dir() -> Path:
    return cache_root() / "llama.cpp"


def find_llama_server() -> Path | None:
    """The newest cached build for this CPU's ISA tag, if any."""
    tag, _ = isa_options(cpu_flags())
    found = sorted(cache_dir().glob(f"*-{tag}/build/bin/llama-server"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def find_or_build_llama_server(jobs: int = 2, log=sys.stderr) -> Path:
    found = find_llama_server()
    if found is not None:
        return found
    tag, opts = isa_options(cpu_flags())
    with tempfile.TemporaryDirectory() as tmp:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", PACKAGE, "-d", tmp],
             "pip download", log)
        sdists = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if not sdists:
            raise BuildError(f"pip download gave no {PACKAGE} source package")
        version = sdists[0].name.removeprefix("llama_cpp_python-").removesuffix(".tar.gz")
        root = cache_dir() / f"{version}-{tag}"
        with tarfile.open(sdists[0]) as tar:
            _extract_stripped(tar, root / "src")
    source = root / "src" / "vendor" / "llama.cpp"
    flags = [f"-D{k}={'ON' if v else 'OFF'}" for k, v in opts.items()]
    _run(["cmake", "-S", str(source), "-B", str(root / "build"), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
          "-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON",
          *flags], "cmake configure", log)
    _run(["cmake", "--build", str(root / "build"), "--target", "llama-server", f"-j{jobs}"], "cmake build", log)
    binary = root / "build" / "bin" / "llama-server"
    if not binary.exists():
        raise BuildError(f"the build finished without {binary}")
    return binary


def _extract_stripped(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract without the sdist's top folder (llama_cpp_python-<version>/)."""
    dest.mkdir(parents=True, exist_ok=True)
    for member in tar.getmembers():
        parts = Path(member.name).parts[1:]
        if not parts or ".." in parts or member.issym() or member.islnk():
            continue
        member.name = str(Path(*parts))
        tar.extract(member, dest)


def _run(cmd: list[str], step: str, log) -> None:
    print(f"llama.cpp: {step}: {' '.join(cmd)}", file=log, flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{step} failed ({proc.returncode}): {proc.stdout[-2000:]}")
