"""Paged attention for a flattened batch that mixes prefill chunks and decode tokens.

The pool (kv_cache.py) is [block, layer, K/V, kv_head, slot, head_dim]. Attention addresses it
through two row views of the same memory:

    run  = one head's block_size slots of one block:  run  = ((b * L + l) * 2 + kv) * KVH + h
    slot = one head's vector of one token:             slot = run * block_size + s

The runner computes layer-0 K indices once per step; layer l adds l * 2 * KVH runs (times
block_size for slots) and V adds KVH runs. Writing a step's new K/V is one index_copy_ per tensor;
reading a request's context is one index_select of whole runs that lands directly in the
[KVH, tokens, head_dim] layout attention wants.

- A prefill chunk starting at position 0 attends over its own fresh K/V (causal).
- A chunk after cached or earlier tokens reads its context from the pool, with a causal mask
  offset by its start.
- All single-token queries (decodes) run as one batched attention. With the native kernel
  (native_attention.py) it reads each request's blocks in place; on the torch path the g query
  heads sharing a KV head are laid out as g query rows against that head's gathered keys, padded
  to the longest context and masked by context length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from raypd.engine.cache.kv_cache import PagedKVCache
from raypd.engine.model.native_attention import NativeDecodeAttention


@dataclass(frozen=True, slots=True)
class PrefillSegment:
    q_start: int  # offset of the chunk's first token in the flattened batch
    q_len: int
    start: int  # position of the chunk's first token in its request
    context_runs: torch.Tensor | None  # [KVH * blocks] layer-0 K runs, head-major; None when start == 0
    mask: torch.Tensor | None  # [q_len, start + q_len] causal mask offset by start; None when start == 0


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    q_index: torch.Tensor  # [D] offsets of the decode tokens in the flattened batch
    # torch path:
    context_runs: torch.Tensor | None = None  # [D * KVH * W] layer-0 K runs, padded to W blocks
    mask: torch.Tensor | None = None  # [D, 1, 1, W * block_size] True where the slot is inside the context
    # native path:
    kernel: NativeDecodeAttention | None = None
    tables: torch.Tensor | None = None  # [D, W] block ids, padded
    ctx_lens: torch.Tensor | None = None  # [D] tokens of context including the decode token


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    write_slots: torch.Tensor  # [T * KVH] layer-0 K slot of each new token's K, token-major
    prefills: tuple[PrefillSegment, ...]
    decode: DecodeBatch | None


def paged_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: PagedKVCache,
                    meta: AttentionMetadata) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, KVH, D]. Writes k, v into the pool, returns [T, H, D]."""
    hd = q.shape[-1]
    kvh, bs = kv.kv_heads, kv.block_size
    run_base, v_runs = layer * 2 * kvh, kvh
    write = meta.write_slots + run_base * bs
    kv.slot_rows.index_copy_(0, write, k.reshape(-1, hd))
    kv.slot_rows.index_copy_(0, write + v_runs * bs, v.reshape(-1, hd))
    out = torch.empty_like(q)
    for seg in meta.prefills:
        end = seg.q_start + seg.q_len
        qs = q[seg.q_start:end].transpose(0, 1).unsqueeze(0)  # [1, H, q_len, D]
        if seg.context_runs is None:
            ks = k[seg.q_start:end].transpose(0, 1).unsqueeze(0)
            vs = v[seg.q_start:end].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        else:
            ctx = seg.start + seg.q_len
            runs = seg.context_runs + run_base
            ks = kv.run_rows.index_select(0, runs).view(1, kvh, -1, hd)[:, :, :ctx]
            vs = kv.run_rows.index_select(0, runs + v_runs).view(1, kvh, -1, hd)[:, :, :ctx]
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=seg.mask, enable_gqa=True)
        out[seg.q_start:end] = o.squeeze(0).transpose(0, 1)
    d = meta.decode
    if d is not None and d.kernel is not None:
        assert d.tables is not None and d.ctx_lens is not None, "the native path needs tables and ctx_lens"
        out[d.q_index] = d.kernel(kv.pool, layer, q.index_select(0, d.q_index), d.tables, d.ctx_lens)
    elif d is not None:
        assert d.context_runs is not None, "the torch path needs context_runs"
        n = d.q_index.shape[0]
        qd = q.index_select(0, d.q_index).view(n, kvh, -1, hd)  # g query rows per KV head
        runs = d.context_runs + run_base
        kd = kv.run_rows.index_select(0, runs).view(n, kvh, -1, hd)
        vd = kv.run_rows.index_select(0, runs + v_runs).view(n, kvh, -1, hd)
        o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=d.mask)
        out[d.q_index] = o.reshape(n, -1, hd)
    return out
