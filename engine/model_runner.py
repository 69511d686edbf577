"""Build the step's tensors from the scheduled batch (ints -> tensors), run the model, sample.

All index arithmetic is numpy over whole requests; nothing here loops per token. The indices are
layer-0 K positions in the pool's row views (attention.py has the formulas).
"""
from __future__ import annotations

import numpy as np
import torch

from raypd.engine.cache.kv_cache import PagedKVCache
from raypd.engine.model.attention import AttentionMetadata, DecodeBatch, PrefillSegment
from raypd.engine.model.llama import LlamaModel
from raypd.engine.model.native_attention import NativeDecodeAttention
from raypd.engine.sampler import Sampler
from raypd.engine.scheduler import ScheduledBatch, ScheduledRequest


def item_rows(item: ScheduledRequest, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One scheduled item's (block table up to its context, positions, token ids) for this step."""
    req, start, ctx = item.request, item.start, item.start + item.num_tokens
    return (np.asarray(req.block_table[:-(-ctx // block_size)], dtype=np.int64), np.arange(start, ctx, dtype=np.int64),
            np.asarray(req.token_ids[start:ctx], dtype=np.int64))


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: PagedKVCache, sampler: Sampler, device: torch.device,
                 decode_kernel: NativeDecodeAttention | None = None):
        self.model = model
        self.decode_kernel = decode_kernel
        self.kv = kv_cache
        self.sampler = sampler
        self.device = device
        self.block_size = kv_cache.block_size
        self._heads = np.arange(kv_cache.kv_heads, dtype=np.int64)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[int | None]:
        """One forward pass; returns the sampled token per item (None for a mid-prompt chunk)."""
        bs = self.block_size
        ids, pos, write = [], [], []
        prefills: list[PrefillSegment] = []
        decodes: list[tuple[int, np.ndarray, int]] = []  # (offset in batch, context runs [KVH, blocks], ctx)
        logits_index = []
        offset = 0
        for item in batch.items:
            start, n = item.start, item.num_tokens
            ctx = start + n
            table, positions, token_ids = item_rows(item, bs)
            ids.append(token_ids)
            pos.append(positions)
            runs = self._runs(table)  # [KVH, blocks]
            # slot of (token, head) = run of (its block, head) * bs + offset in block; token-major
            write.append((runs[:, positions // bs].T * bs + (positions % bs)[:, None]).ravel())
            if n == 1:
                decodes.append((offset, table if self.decode_kernel else runs, ctx))
            elif start == 0:
                prefills.append(PrefillSegment(offset, n, 0, None, None))
            else:
                mask = np.arange(ctx)[None, :] <= positions[:, None]
                prefills.append(PrefillSegment(offset, n, start, self._tensor(runs.ravel()),
                                               torch.from_numpy(mask).to(self.device)))
            offset += n
            if item.samples:
                logits_index.append(offset - 1)
        meta = AttentionMetadata(write_slots=self._tensor(np.concatenate(write)), prefills=tuple(prefills),
                                 decode=self._decode_batch(decodes))
        sampling = [item for item in batch.items if item.samples]
        if not sampling:
            logits_index = [0]  # the model still computes one row; it is discarded
        logits = self.model.forward(self._tensor(np.concatenate(ids)), self._tensor(np.concatenate(pos)), meta,
                                    self.kv, self._tensor(np.asarray(logits_index, dtype=np.int64)))
        tokens = self.sampler.sample(logits, [x.request for x in sampling]) if sampling else []
        it = iter(tokens)
        return [next(it) if item.samples else None for item in batch.items]

    def _runs(self, table: np.ndarray) -> np.ndarray:
        """Layer-0 K runs of each (kv head, block): [KVH, len(table)]."""
        return self._heads[:, None] + (table * self.kv.runs_per_block)[None, :]

    def _decode_batch(self, decodes: list[tuple[int, np.ndarray, int]]) -> DecodeBatch | None:
        """decodes: (offset, block table or runs, ctx) per decode token."""
        if not decodes:
            return None
        q_index = self._tensor(np.asarray([o for o, _, _ in decodes], dtype=np.int64))
        if self.decode_kernel is not None:
            width = max(len(table) for _, table, _ in decodes)
            tables = np.zeros((len(decodes), width), dtype=np.int64)  # padding is never read
            for i, (_, table, _) in enumerate(decodes):
                tables[i, :len(table)] = table
            return DecodeBatch(q_index=q_index, kernel=self.decode_kernel, tables=torch.from_numpy(tables),
                               ctx_lens=torch.from_numpy(np.asarray([c for _, _, c in decodes], dtype=np.int64)))
        width = max(runs.shape[1] for _, runs, _ in decodes)
        padded = np.zeros((len(decodes), self.kv.kv_heads, width), dtype=np.int64)  # run 0 pads, masked out
        for i, (_, runs, _) in enumerate(decodes):
            padded[i, :, :runs.shape[1]] = runs
        lengths = np.asarray([ctx for _, _, ctx in decodes])
        mask = np.arange(width * self.block_size)[None, :] < lengths[:, None]
        return DecodeBatch(q_index=q_index, context_runs=self._tensor(padded.ravel()),
                           mask=torch.from_numpy(mask).to(self.device)[:, None, None, :])

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.device)
