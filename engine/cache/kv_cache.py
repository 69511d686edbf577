"""The paged KV pool: one tensor, block-major.

    pool[block, layer, k_or_v, kv_head, slot_in_block, head_dim]

A block holds every layer's K and V for `block_size` consecutive tokens in one contiguous byte
range, so moving a request's KV to another process costs one descriptor per block (and adjacent
blocks merge into one), instead of layers x 2 small descriptors in a per-layer layout.
Inside a block, each (layer, K/V, head) keeps its `block_size` tokens contiguous, so attention
reads a request's context in runs of block_size x head_dim values (see attention.py).
"""
from __future__ import annotations

import torch

from raypd.engine.cache import host_memory
from raypd.engine.model.config import ModelConfig


class PagedKVCache:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.kv_heads = cfg.num_kv_heads
        # Huge pages on the host: cross-process KV writes (CMA) pin every page they touch.
        self.pool = host_memory.zeros((num_blocks, cfg.num_layers, 2, cfg.num_kv_heads, block_size, cfg.head_dim),
                                      dtype, device)
        # Two row views of the same memory; attention.py explains the index arithmetic.
        self.slot_rows = self.pool.view(-1, cfg.head_dim)  # one token of one head
        self.run_rows = self.pool.view(-1, block_size * cfg.head_dim)  # one block of one head
        self.runs_per_block = cfg.num_layers * 2 * cfg.num_kv_heads

    @staticmethod
    def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        return cfg.num_layers * 2 * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize

    @property
    def block_nbytes(self) -> int:
        return self.pool[0].numel() * self.pool.element_size()
