"""The model runner on a GPU: the step's rows as the Triton attention wants them, decode-only steps
replayed from CUDA graphs, everything else eager.

Row order: the batch's decode items first (one token each), then its prefill chunks, whatever the
scheduler's order; tokens come back in the scheduler's order. Index arithmetic is numpy over whole
requests, and each step's integers reach the device in two copies (one int64, one int32 buffer)
that are sliced there, instead of one copy per tensor.

One host synchronisation per step: the sampled tokens' transfer (Sampler.sample).

An attention backend that plans each step on the host (FlashInfer: flashinfer_attention.py) is the
runner's StepPlanner: planned before every eager forward and every graph replay.

Triton compiles a kernel once per specialization of its arguments, which includes whether an
integer is divisible by 16 and whether a pointer is 16-byte aligned. So every block table is padded
to a multiple of TABLE_COLUMNS columns and every slice of the packed copies starts 16-byte aligned:
the steps then launch the variants compiled at start (warm_up), never a new one mid-serving.
"""
from __future__ import annotations

from itertools import chain
from typing import Protocol

import numpy as np
import torch

from raypd.engine.cache.kv_cache import PagedKVCache
from raypd.engine.gpu.cuda_graphs import DecodeGraphs, DecodeHostRows, DecodeInputs, bucket_for
from raypd.engine.gpu.step_timer import StepTimer
from raypd.engine.gpu.triton_attention import PrefillChunks, TritonAttentionMetadata
from raypd.engine.model.llama import LlamaModel
from raypd.engine.model_runner import item_rows
from raypd.engine.overlap import PENDING, LaunchedDecode
from raypd.engine.sampler import Sampler
from raypd.engine.scheduler import ScheduledBatch, ScheduledRequest

TABLE_COLUMNS = 16  # block tables are padded to a multiple of this many columns
ALIGN_BYTES = 16


def padded_width(blocks: int) -> int:
    return -(-max(blocks, 1) // TABLE_COLUMNS) * TABLE_COLUMNS


def decode_rows(items: list[ScheduledRequest], block_size: int, width: int | None = None) -> DecodeHostRows:
    """The host rows of decode items (one token each); width: the tables' columns (default: the widest).
    Every table's used entries go through numpy in one flat copy (hundreds of rows per step)."""
    n = len(items)
    reqs = [x.request for x in items]
    start_list = [x.start for x in items]
    starts = np.array(start_list, dtype=np.int64)
    ids = np.fromiter((r.token_ids[s] for r, s in zip(reqs, start_list)), dtype=np.int64, count=n)
    used = starts // block_size + 1  # blocks up to and including the one the new token goes to
    flat = np.fromiter(chain.from_iterable(r.block_table[:u] for r, u in zip(reqs, used.tolist())),
                       dtype=np.int32, count=int(used.sum()))
    tables = np.zeros((n, width or padded_width(int(used.max()))), dtype=np.int32)
    tables[np.arange(tables.shape[1]) < used[:, None]] = flat  # row-major: each row's used columns
    last = flat[np.cumsum(used) - 1].astype(np.int64)
    return DecodeHostRows(ids, starts, last * block_size + starts % block_size, (starts + 1).astype(np.int32), tables)


class StepPlanner(Protocol):
    """An attention backend that plans each step on the host before its forward runs
    (flashinfer_attention.FlashInferAttention); the Triton kernels need none."""

    def plan_step(self, decode_ctx_lens: np.ndarray | None, decode_tables: np.ndarray | None,
                  chunk_lens: list[int], chunk_starts: list[int], chunk_tables: list[np.ndarray]) -> None: ...

    def plan_graph(self, size: int, ctx_lens: np.ndarray, tables: np.ndarray) -> None: ...

    def use_graph(self, size: int, max_blocks: int) -> None: ...


class CudaModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: PagedKVCache, sampler: Sampler, device: torch.device,
                 planner: StepPlanner | None = None):
        self.model = model
        self.planner = planner
        self.kv = kv_cache
        self.sampler = sampler
        self.device = device
        self.block_size = kv_cache.block_size
        self.graphs: DecodeGraphs | None = None  # set by the engine after capture (capture_graphs)
        self.timer: StepTimer | None = None      # set by benchmarks
        # Overlapped steps' tokens reach the host here: two buffers used in turn, since one step's
        # copy may land while the previous step's tokens are still being read (made on first use).
        self._token_copies: list[torch.Tensor] = []
        self._turn = 0

    def decode_forward(self, inputs: DecodeInputs) -> torch.Tensor:
        """The forward of a decode-only step whose every row samples: what the graphs capture."""
        if self.planner is not None:  # runs (and plans, the first time) outside the capture: see the planner
            self.planner.use_graph(inputs.input_ids.shape[0], inputs.tables.shape[1])
        meta = TritonAttentionMetadata(inputs.slots, inputs.input_ids.shape[0], inputs.tables, inputs.ctx_lens, None)
        index = torch.arange(inputs.input_ids.shape[0], device=self.device)
        return self.model.forward(inputs.input_ids, inputs.positions, meta, self.kv, index)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[int | None]:
        """One forward pass; returns the sampled token per item (None for a mid-prompt chunk)."""
        items = batch.items
        decodes: list[int] = []  # one token after earlier ones: a decode row (a 1-token chunk is one too)
        prefills: list[int] = []
        for i, x in enumerate(items):
            (decodes if x.num_tokens == 1 and x.start > 0 else prefills).append(i)
        order = decodes + prefills
        graphs = self.graphs
        rows = decode_rows([items[i] for i in decodes], self.block_size) if decodes else None
        timer = self.timer
        if timer is not None:
            timer.begin()
        if not prefills and rows is not None and graphs is not None and graphs.serves(len(decodes), rows.tables.shape[1]):
            if self.planner is not None:
                size = bucket_for(len(decodes), graphs.sizes)
                assert size is not None, "serves() holds every batch up to the largest size"
                self.planner.plan_graph(size, rows.ctx_lens, rows.tables)
            logits = graphs.run(rows)
            kind = "graph"
        else:
            logits = self._eager(items, order, len(decodes), rows)
            kind = "eager-decode" if not prefills else "mixed" if decodes else "prefill"
        if timer is not None:  # the step's one synchronisation, a moment earlier and timed
            timer.launched(kind, len(decodes))
            timer.wait_launched()
        # Logit rows: one per decode row (a one-token chunk that does not sample is among them), then
        # one per sampling prefill chunk.
        samples = [x.samples for x in items]
        sampling = [i for i in order if samples[i]]
        keep = [j for j, i in enumerate(decodes) if samples[i]]
        if len(keep) != len(decodes):
            rest = len(sampling) - len(keep)
            logits = logits[torch.tensor(keep + list(range(len(decodes), len(decodes) + rest)), device=self.device)]
        tokens = self.sampler.sample(logits, [items[i].request for i in sampling]) if sampling else []
        out: list[int | None] = [None] * len(items)
        for i, t in zip(sampling, tokens):
            out[i] = t
        return out

    def can_launch_ahead(self, items: list[ScheduledRequest]) -> bool:
        """Whether a batch can run as an overlapped step (engine/overlap.py): decode rows only (one
        token each after earlier ones), every one greedy without penalties, replayable from a graph.
        Not with a planner: FlashInfer's plan stages its work lists in one pinned host buffer that the
        step in flight may not have copied yet."""
        graphs = self.graphs
        if graphs is None or not items or self.planner is not None:
            return False
        if not all(x.num_tokens == 1 and x.start > 0 for x in items) or not self.sampler.defers([x.request for x in items]):
            return False
        return graphs.serves(len(items), padded_width(max(x.start for x in items) // self.block_size + 1))

    @torch.inference_mode()
    def launch_ahead(self, items: list[ScheduledRequest], previous: LaunchedDecode | None) -> LaunchedDecode:
        """Launch a decode step that can_launch_ahead() accepted and return at once: its greedy tokens
        stay on the device, their copy to the host is under way. A row whose input token is PENDING
        takes it from `previous` (the step in flight) on the device."""
        assert self.graphs is not None
        rows = decode_rows(items, self.block_size)
        sources = None
        if previous is not None:
            where = previous.row_of()
            sources = np.fromiter((where.get(id(x.request), -1) if x.request.token_ids[x.start] == PENDING else -1
                                   for x in items), dtype=np.int64, count=len(items))
        assert ((rows.input_ids != PENDING) | (sources >= 0 if sources is not None else False)).all(), \
            "a PENDING input token that is not in the step in flight"
        timer = self.timer
        if timer is not None:
            timer.begin()
        logits = self.graphs.run(rows, previous.tokens if previous is not None else None, sources)
        tokens = self.sampler.greedy(logits)
        if timer is not None:
            timer.launched("graph", len(items))
        if not self._token_copies or self._token_copies[0].shape[0] < len(items):
            size = self.graphs.sizes[-1]
            self._token_copies = [torch.zeros(size, dtype=torch.int64, pin_memory=self.device.type == "cuda")
                                  for _ in range(2)]
        self._turn ^= 1
        host = self._token_copies[self._turn][:len(items)]
        host.copy_(tokens, non_blocking=True)
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        return LaunchedDecode(items, tokens, host, done)

    def collect(self, launched: LaunchedDecode) -> list[int]:
        """The launched step's tokens on the host: the one wait for the GPU of an overlapped step."""
        if launched.done is not None:
            if self.timer is not None:
                self.timer.wait(launched.done)
            else:
                launched.done.synchronize()
        return launched.host.tolist()

    def _eager(self, items: list[ScheduledRequest], order: list[int], num_decode: int,
               rows: DecodeHostRows | None) -> torch.Tensor:
        """Logits of the sampling rows, in `order`, from an eager forward."""
        bs = self.block_size
        ids, pos, slots, logits_index = [], [], [], []
        if rows is not None:
            ids.append(rows.input_ids)
            pos.append(rows.positions)
            slots.append(rows.slots)
            logits_index.append(np.arange(num_decode, dtype=np.int64))
        chunk_lens, starts, tables = [], [], []
        offset = num_decode
        for i in order[num_decode:]:
            x = items[i]
            start, n = x.start, x.num_tokens
            table, positions, token_ids = item_rows(x, bs)
            ids.append(token_ids)
            pos.append(positions)
            slots.append(table[positions // bs] * bs + positions % bs)
            chunk_lens.append(n)
            starts.append(start)
            tables.append(table)
            offset += n
            if x.samples:
                logits_index.append(np.asarray([offset - 1], dtype=np.int64))
        if not logits_index:
            logits_index.append(np.zeros(1, dtype=np.int64))  # the model computes one row; discarded
        # Two host-to-device copies: every int64 array, then every int32 array, sliced on the device.
        longs = [np.concatenate(ids), np.concatenate(pos), np.concatenate(slots), np.concatenate(logits_index)]
        ints: list[np.ndarray] = []
        if rows is not None:
            ints += [rows.ctx_lens, rows.tables.ravel()]
        if chunk_lens:
            width = padded_width(max(len(t) for t in tables))
            padded = np.zeros((len(tables), width), dtype=np.int32)
            for j, t in enumerate(tables):
                padded[j, :len(t)] = t
            ints += [np.concatenate([[0], np.cumsum(chunk_lens)]).astype(np.int32), np.asarray(starts, np.int32),
                     padded.ravel()]
        if self.planner is not None:
            self.planner.plan_step(rows.ctx_lens if rows is not None else None, rows.tables if rows is not None else None,
                                   chunk_lens, starts, tables)
        dev_longs = self._split(longs, torch.int64)
        dev_ints = self._split(ints, torch.int32) if ints else []
        decode_tables = decode_ctx = None
        if rows is not None:
            decode_ctx, flat = dev_ints[0], dev_ints[1]
            decode_tables = flat.view(num_decode, rows.tables.shape[1])
            dev_ints = dev_ints[2:]
        prefill = None
        if chunk_lens:
            cu_q, starts_t, flat = dev_ints
            prefill = PrefillChunks(cu_q, starts_t, flat.view(len(chunk_lens), -1), max(chunk_lens))
        meta = TritonAttentionMetadata(dev_longs[2], num_decode, decode_tables, decode_ctx, prefill)
        return self.model.forward(dev_longs[0], dev_longs[1], meta, self.kv, dev_longs[3])

    def _split(self, arrays: list[np.ndarray], dtype: torch.dtype) -> list[torch.Tensor]:
        """One copy of the concatenated arrays to the device, returned as per-array views, each
        starting 16-byte aligned (see the module docstring)."""
        np_dtype = np.int64 if dtype == torch.int64 else np.int32
        step = ALIGN_BYTES // np.dtype(np_dtype).itemsize
        sizes = [a.size for a in arrays]
        spans = [-(-n // step) * step for n in sizes]
        flat = np.zeros(sum(spans), dtype=np_dtype)
        offsets = np.cumsum([0] + spans[:-1])
        for a, at in zip(arrays, offsets):
            flat[at:at + a.size] = a.ravel()
        dev = torch.from_numpy(flat).to(self.device, non_blocking=False)
        return [dev[at:at + n] for at, n in zip(offsets.tolist(), sizes)]

    def warm_up(self) -> None:
        """Compile the kernels' variants before the first request (paged_attention.compile_variants);
        the layer ops compile during the first forward, which graph capture or the KV profile runs."""
        from raypd.engine.gpu import paged_attention
        paged_attention.compile_variants(self.kv.pool, self.model.cfg.num_heads)
