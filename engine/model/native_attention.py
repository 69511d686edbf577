"""The CPU decode-attention kernel (csrc/paged_decode.c), compiled on first use and called via ctypes.

Why a kernel of our own: torch has no paged attention on CPU, so the torch path copies every
decode's context out of the pool before attending, and decode attention on CPU is bound by memory
traffic (see the C file). It reads float32 or bfloat16 pools (q and the output in the pool's
dtype), always summing in float32. native_build.py compiles it. Without a C compiler, on a GPU, or
for a float16 pool, attention takes the torch path instead.
"""
from __future__ import annotations

import ctypes
from functools import lru_cache

import torch

from raypd.engine.model import native_build
from raypd.engine.model.native_build import KernelUnavailable

__all__ = ["KernelUnavailable", "NativeDecodeAttention", "supports"]

_VOID, _I64 = ctypes.c_void_p, ctypes.c_int64
POOL_DTYPES = (torch.float32, torch.bfloat16)


class NativeDecodeAttention:
    """Decode attention over the pool in place, on num_threads threads of its own."""

    def __init__(self, num_threads: int):
        self._fn = _load_library().raypd_paged_decode_attention
        self.num_threads = max(1, num_threads)

    def __call__(self, pool: torch.Tensor, layer: int, q: torch.Tensor, tables: torch.Tensor,
                 ctx_lens: torch.Tensor) -> torch.Tensor:
        """pool: [blocks, L, 2, KVH, bs, hd] float32 or bfloat16; q: [D, H, hd] of the pool's dtype;
        tables: [D, W] int64; ctx_lens: [D]."""
        if q.dtype != pool.dtype:
            raise TypeError(f"q is {q.dtype} but the pool is {pool.dtype}")
        q = q.contiguous()
        num_decodes, heads, head_dim = q.shape
        _, _, _, kv_heads, block_size, _ = pool.shape
        out = torch.empty_like(q)
        rc = self._fn(pool.data_ptr(), q.data_ptr(), out.data_ptr(), tables.data_ptr(), ctx_lens.data_ptr(),
                      num_decodes, tables.shape[1], heads, kv_heads, head_dim, block_size, layer,
                      pool.shape[1] * 2 * kv_heads, head_dim ** -0.5, self.num_threads,
                      int(pool.dtype == torch.bfloat16))
        if rc != 0:
            raise RuntimeError(f"native decode attention failed with code {rc}")
        return out


def supports(pool: torch.Tensor, num_heads: int) -> str | None:
    """None when the kernel can serve this pool, else why not."""
    if pool.device.type != "cpu":
        return f"the pool is on {pool.device.type}"
    if pool.dtype not in POOL_DTYPES:
        return f"the pool is {pool.dtype} (the kernel reads float32 or bfloat16)"
    if not pool.is_contiguous():
        return "the pool is not contiguous"
    kv_heads, head_dim = pool.shape[3], pool.shape[5]
    if num_heads % kv_heads or num_heads // kv_heads > 16 or head_dim > 256:
        return f"{num_heads} heads over {kv_heads} KV heads of dim {head_dim} is outside the kernel's limits"
    return None


@lru_cache(maxsize=1)
def _load_library() -> ctypes.CDLL:
    """Build (once per source, flags and CPU) and load the kernel; KernelUnavailable if it cannot."""
    lib = native_build.load("paged_decode.c")
    fn = lib.raypd_paged_decode_attention
    fn.argtypes = [_VOID, _VOID, _VOID, _VOID, _VOID] + [_I64] * 8 + [ctypes.c_float, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return lib
