"""Attention on the Triton kernels (paged_attention.py) for a step whose rows are ordered decode
tokens first, then prefill chunks:

    rows [0, num_decode)        one query token per sequence: decode_attention over its block table
    rows [num_decode, T)        prefill chunks (fresh prompts and chunks after a cached prefix):
                                prefill_attention, varlen over cu_q, causal from each chunk's start

Every row's new K/V is written into the pool first (one write_kv launch; padding rows have slot -1),
so both kernels read all keys, the step's own included, from the pool in place: nothing is gathered.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from raypd.engine.cache.kv_cache import PagedKVCache


@dataclass(frozen=True, slots=True)
class PrefillChunks:
    cu_q: torch.Tensor    # [S+1] int32: chunk s's rows are num_decode + cu_q[s] .. num_decode + cu_q[s+1]
    starts: torch.Tensor  # [S] int32: position of each chunk's first token
    tables: torch.Tensor  # [S, W] int32 block ids
    max_q_len: int


@dataclass(frozen=True, slots=True)
class TritonAttentionMetadata:
    slots: torch.Tensor              # [T] int64: block * block_size + offset of each row's K/V; -1: skip
    num_decode: int
    decode_tables: torch.Tensor | None   # [num_decode, W] int32
    decode_ctx_lens: torch.Tensor | None  # [num_decode] int32, 0 for a padding row
    prefill: PrefillChunks | None


class TritonAttention:
    """The model's attention callable (LlamaModel's `attention`) on the Triton kernels."""

    def __init__(self, head_dim: int):
        from raypd.engine.gpu import paged_attention  # imports Triton: only engines on this path load it
        self.kernels = paged_attention
        self.scale = head_dim ** -0.5  # as transformers' Llama: head_dim ** -0.5

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: PagedKVCache,
                 meta: TritonAttentionMetadata) -> torch.Tensor:
        kernels = self.kernels
        kernels.write_kv(kv.pool, layer, k, v, meta.slots)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        d = meta.num_decode
        if d:
            assert meta.decode_tables is not None and meta.decode_ctx_lens is not None, "decode rows need tables"
            kernels.decode_attention(q[:d], kv.pool, layer, meta.decode_tables, meta.decode_ctx_lens, self.scale,
                                     out=out[:d])
        p = meta.prefill
        if p is not None:
            kernels.prefill_attention(q[d:], kv.pool, layer, p.cu_q, p.starts, p.tables, p.max_q_len, self.scale,
                                      out=out[d:])
        return out
