"""Paged attention for a flattened batch that mixes prefill chunks and decode tokens.

Every token's K/V is first written into its slot of the pool. Then:
- a prefill segment (a request's chunk of more than one token) attends over its context; when the
  chunk starts at position 0 its fresh K/V are used directly, otherwise the request's blocks are
  gathered (cached prefix or earlier chunks);
- all single-token (decode) queries are batched: their block tables are padded to one length,
  gathered in one indexing op, and masked by context length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class PrefillSegment:
    q_start: int  # offset of the chunk's first token in the flattened batch
    q_len: int
    start: int  # position of the chunk's first token in its request
    blocks: torch.Tensor  # block ids covering positions [0, start + q_len)


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    q_index: torch.Tensor  # [D] offsets of the decode tokens in the flattened batch
    block_table: torch.Tensor  # [D, max_blocks], padded with block 0
    mask: torch.Tensor  # [D, 1, 1, max_blocks * block_size], True where the key is in context


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    slot_blocks: torch.Tensor  # [T] block of each token's KV slot
    slot_offsets: torch.Tensor  # [T] offset inside that block
    prefills: tuple[PrefillSegment, ...]
    decode: DecodeBatch | None


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, KVH, D]; caches: [blocks, block_size, KVH, D]. Returns [T, H, D]."""
    k_cache[meta.slot_blocks, meta.slot_offsets] = k
    v_cache[meta.slot_blocks, meta.slot_offsets] = v
    out = torch.empty_like(q)
    for seg in meta.prefills:
        end = seg.q_start + seg.q_len
        qs = q[seg.q_start:end].transpose(0, 1).unsqueeze(0)
        if seg.start == 0:
            ks, vs = k[seg.q_start:end], v[seg.q_start:end]
            mask, causal = None, True
        else:
            ctx = seg.start + seg.q_len
            ks = k_cache[seg.blocks].flatten(0, 1)[:ctx]
            vs = v_cache[seg.blocks].flatten(0, 1)[:ctx]
            # Query i sits at position start + i and sees keys up to there.
            q_pos = torch.arange(seg.start, ctx, device=q.device).unsqueeze(1)
            mask, causal = torch.arange(ctx, device=q.device).unsqueeze(0) <= q_pos, False
        o = F.scaled_dot_product_attention(qs, ks.transpose(0, 1).unsqueeze(0), vs.transpose(0, 1).unsqueeze(0),
                                           attn_mask=mask, is_causal=causal, enable_gqa=True)
        out[seg.q_start:end] = o.squeeze(0).transpose(0, 1)
    if meta.decode is not None:
        d = meta.decode
        qd = q[d.q_index].unsqueeze(2)  # [D, H, 1, hd]
        kd = k_cache[d.block_table].flatten(1, 2).transpose(1, 2)  # [D, KVH, S, hd]
        vd = v_cache[d.block_table].flatten(1, 2).transpose(1, 2)
        o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=d.mask, enable_gqa=True)
        out[d.q_index] = o.squeeze(2)
    return out
