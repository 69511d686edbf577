"""Build the step's tensors from the scheduled batch (ints -> tensors), run the model, sample."""
from __future__ import annotations

import numpy as np
import torch

from engine.attention import AttentionMetadata, DecodeBatch, PrefillSegment
from engine.kv_cache import PagedKVCache
from engine.model import LlamaModel
from engine.sampler import Sampler
from engine.scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: PagedKVCache, sampler: Sampler, device: torch.device):
        self.model = model
        self.kv = kv_cache
        self.sampler = sampler
        self.device = device
        self.block_size = kv_cache.block_size

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[int | None]:
        """One forward pass; returns the sampled token per item (None for a mid-prompt chunk)."""
        bs = self.block_size
        ids, pos, slot_b, slot_o = [], [], [], []
        prefills: list[PrefillSegment] = []
        dec_index, dec_tables, dec_ctx = [], [], []
        logits_index = []
        offset = 0
        for item in batch.items:
            req, start, n = item.request, item.start, item.num_tokens
            positions = np.arange(start, start + n)
            table = np.asarray(req.block_table, dtype=np.int64)
            ids.append(np.asarray(req.token_ids[start:start + n], dtype=np.int64))
            pos.append(positions)
            slot_b.append(table[positions // bs])
            slot_o.append(positions % bs)
            ctx = start + n
            if n == 1:
                dec_index.append(offset)
                dec_tables.append(table[:-(-ctx // bs)])
                dec_ctx.append(ctx)
            else:
                prefills.append(PrefillSegment(q_start=offset, q_len=n, start=start,
                                               blocks=self._tensor(table[:-(-ctx // bs)])))
            offset += n
            if item.samples:
                logits_index.append(offset - 1)
        meta = AttentionMetadata(
            slot_blocks=self._tensor(np.concatenate(slot_b)),
            slot_offsets=self._tensor(np.concatenate(slot_o)),
            prefills=tuple(prefills),
            decode=self._decode_batch(dec_index, dec_tables, dec_ctx),
        )
        sampling = [item for item in batch.items if item.samples]
        if not sampling:
            logits_index = [0]  # the model still needs a row to compute; it is discarded
        logits = self.model.forward(self._tensor(np.concatenate(ids)), self._tensor(np.concatenate(pos)), meta,
                                    self.kv, self._tensor(np.asarray(logits_index, dtype=np.int64)))
        tokens = self.sampler.sample(logits, [x.request for x in sampling]) if sampling else []
        it = iter(tokens)
        return [next(it) if item.samples else None for item in batch.items]

    def _decode_batch(self, index: list[int], tables: list[np.ndarray], ctx: list[int]) -> DecodeBatch | None:
        if not index:
            return None
        width = max(len(t) for t in tables)
        padded = np.zeros((len(tables), width), dtype=np.int64)
        for i, t in enumerate(tables):
            padded[i, :len(t)] = t
        mask = np.arange(width * self.block_size)[None, :] < np.asarray(ctx)[:, None]
        return DecodeBatch(q_index=self._tensor(np.asarray(index, dtype=np.int64)), block_table=self._tensor(padded),
                           mask=torch.from_numpy(mask).to(self.device)[:, None, None, :])

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.device)
