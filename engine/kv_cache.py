"""The paged KV pool: one tensor, block-major.

    pool[block, layer, k_or_v, slot_in_block, kv_head, head_dim]

A block holds every layer's K and V for `block_size` consecutive tokens in one contiguous byte
range, so moving a request's KV to another process costs one descriptor per block (and adjacent
blocks merge into one), instead of layers x 2 small descriptors in a per-layer layout.
The price is a strided per-layer view: a layer's K for all blocks is `pool[:, layer, 0]`.
"""
from __future__ import annotations

import torch

from engine.model_config import ModelConfig


class PagedKVCache:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.pool = torch.zeros(num_blocks, cfg.num_layers, 2, block_size, cfg.num_kv_heads, cfg.head_dim,
                                dtype=dtype, device=device)

    @staticmethod
    def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        return cfg.num_layers * 2 * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize

    @property
    def block_nbytes(self) -> int:
        return self.pool[0].numel() * self.pool.element_size()

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V views of one layer: [num_blocks, block_size, kv_heads, head_dim] each."""
        return self.pool[:, layer, 0], self.pool[:, layer, 1]
