"""The CPU decode-attention kernel (csrc/paged_decode.c), compiled on first use and called via ctypes.

Why a kernel of our own: torch has no paged attention on CPU, so the torch path copies every
decode's context out of the pool before attending, and decode attention on CPU is bound by memory
traffic (see the C file). The kernel is plain C (no torch headers, so it compiles in about a second
with the system compiler) and is built once per source and CPU into the cache folder. Without a C
compiler, on a GPU, or for a pool that is not float32, attention takes the torch path instead.
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
from functools import lru_cache
from pathlib import Path

import torch

from raypd.engine.model.source import cache_root

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_decode.c"
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
_VOID, _I64 = ctypes.c_void_p, ctypes.c_int64


class KernelUnavailable(RuntimeError):
    """The native kernel cannot be built or loaded here (no compiler, unsupported platform...)."""


class NativeDecodeAttention:
    """Decode attention over the pool in place, on num_threads threads of its own."""

    def __init__(self, num_threads: int):
        self._fn = _load_library().raypd_paged_decode_attention
        self.num_threads = max(1, num_threads)

    def __call__(self, pool: torch.Tensor, layer: int, q: torch.Tensor, tables: torch.Tensor,
                 ctx_lens: torch.Tensor) -> torch.Tensor:
        """pool: [blocks, L, 2, KVH, bs, hd] float32; q: [D, H, hd]; tables: [D, W] int64; ctx_lens: [D]."""
        q = q.contiguous()
        num_decodes, heads, head_dim = q.shape
        _, _, _, kv_heads, block_size, _ = pool.shape
        out = torch.empty_like(q)
        rc = self._fn(pool.data_ptr(), q.data_ptr(), out.data_ptr(), tables.data_ptr(), ctx_lens.data_ptr(),
                      num_decodes, tables.shape[1], heads, kv_heads, head_dim, block_size, layer,
                      pool.shape[1] * 2 * kv_heads, head_dim ** -0.5, self.num_threads)
        if rc != 0:
            raise RuntimeError(f"native decode attention failed with code {rc}")
        return out


def supports(pool: torch.Tensor, num_heads: int) -> str | None:
    """None when the kernel can serve this pool, else why not."""
    if pool.device.type != "cpu":
        return f"the pool is on {pool.device.type}"
    if pool.dtype != torch.float32:
        return f"the pool is {pool.dtype} (the kernel reads float32)"
    if not pool.is_contiguous():
        return "the pool is not contiguous"
    kv_heads, head_dim = pool.shape[3], pool.shape[5]
    if num_heads % kv_heads or num_heads // kv_heads > 16 or head_dim > 256:
        return f"{num_heads} heads over {kv_heads} KV heads of dim {head_dim} is outside the kernel's limits"
    return None


@lru_cache(maxsize=1)
def _load_library() -> ctypes.CDLL:
    """Build (once per source, flags and CPU) and load the kernel; KernelUnavailable if it cannot."""
    if platform.system() != "Linux" and platform.system() != "Darwin":
        raise KernelUnavailable(f"no native kernel build on {platform.system()}")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise KernelUnavailable("no C compiler (cc, gcc or clang) on PATH")
    source = SOURCE.read_bytes()
    # -march=native code is only valid on this kind of CPU, and the cache folder may be shared.
    key = hashlib.sha256(source + " ".join(CFLAGS).encode() + _cpu_fingerprint().encode()).hexdigest()[:16]
    target = cache_root() / "kernels" / f"paged_decode-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        # Build beside the target and rename: nodes starting together may all build at once.
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        cmd = [compiler, *CFLAGS, "-o", tmp, str(SOURCE), "-lm"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise KernelUnavailable(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")
            os.replace(tmp, target)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise KernelUnavailable(f"cannot build the kernel: {e}") from e
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        log.info("built the native decode-attention kernel: %s", target)
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        raise KernelUnavailable(f"cannot load {target}: {e}") from e
    fn = lib.raypd_paged_decode_attention
    fn.argtypes = [_VOID, _VOID, _VOID, _VOID, _VOID] + [_I64] * 8 + [ctypes.c_float, ctypes.c_int]
    fn.restype = ctypes.c_int
    return lib


def _cpu_fingerprint() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    wanted = [ln for ln in lines if ln.startswith(("model name", "flags"))][:2]
    return platform.machine() + "\n".join(wanted)
