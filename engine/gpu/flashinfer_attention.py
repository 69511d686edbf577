"""Attention on FlashInfer's paged kernels (`--attention-backend flashinfer`), an optional backend
beside the Triton one: `pip install flashinfer-python`; its kernels compile with nvcc the first time
a shape is planned (minutes; cached under ~/.cache/flashinfer after that), so the engine plans them
while it profiles its memory, before the first request.

The step's rows are ordered as for the Triton kernels (triton_attention.py): decode tokens first,
then prefill chunks. The new K/V go into the pool with the same write_kv kernel, then

    rows [0, num_decode)   BatchDecodeWithPagedKVCacheWrapper
    rows [num_decode, T)   BatchPrefillWithPagedKVCacheWrapper, causal from each chunk's start

both reading the pool in place through its HND view of one layer, pool[:, layer] =
[block, K/V, kv_head, slot, head_dim] (FlashInfer takes the strides, so the other layers between
two blocks cost nothing). Decode runs FlashInfer's CUDA-core decode kernel, or with many query
heads per KV head (TENSOR_CORE_MIN_GROUP) the prefill kernel on tensor cores with a KV head's query
heads as its rows: on the H200 at 4 per KV head the CUDA-core kernel was the faster
(docs/benchmarks.md, "FlashInfer as the attention backend"; slower than the Triton kernels both).

FlashInfer plans a step on the host (page indptr, split sizes), so the runner calls plan_step()
before every eager forward and plan_graph() before every graph replay (no overlap scheduling: see
CudaModelRunner.can_launch_ahead). A decode graph reads a
wrapper of its own (fixed buffers for its batch size), planned each step with that step's rows;
its padding rows read one slot of block 0 and their outputs are dropped (their K/V slot is -1:
nothing is written). Graph wrappers are made, and planned once, in the capture's warm-up run,
which runs before the capture itself (cuda_graphs.CudaGraphFactory): a plan cannot be captured.

The kernels are fa2's (Ampere and later, bf16 and fp16): FlashInfer's fa3 and cuDNN paths would
compile CUTLASS and need packages the base install lacks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raypd.engine.cache.kv_cache import PagedKVCache
from raypd.engine.errors import ConfigError
from raypd.engine.gpu.triton_attention import TritonAttentionMetadata

WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's recommended float workspace (split-K partial results)
# Decode on tensor cores (the prefill kernel, a KV head's query heads as its rows) from this many
# query heads per KV head; below it, FlashInfer's CUDA-core decode kernel. vLLM's rule (more than 4).
TENSOR_CORE_MIN_GROUP = 5
DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = (64, 128, 256)


@dataclass(frozen=True, slots=True)
class PagedRows:
    """Sequences' pages as FlashInfer wants them (CSR over block tables), int32 on the host."""
    indptr: np.ndarray         # [S+1]: sequence s's pages are indices[indptr[s]:indptr[s+1]]
    indices: np.ndarray        # [pages] block ids
    last_page_len: np.ndarray  # [S] tokens in each sequence's last page, 1..block_size


def paged_rows(kv_lens: np.ndarray, tables: np.ndarray, block_size: int) -> PagedRows:
    """The pages of sequences holding kv_lens[s] >= 1 tokens, whose blocks are tables[s, :pages]."""
    lens = np.asarray(kv_lens, dtype=np.int64)
    if lens.size and int(lens.min()) < 1:
        raise ValueError(f"every sequence needs at least one token, got lengths {lens.tolist()}")
    pages = -(-lens // block_size)
    if tables.shape[0] != lens.size or (lens.size and int(pages.max()) > tables.shape[1]):
        raise ValueError(f"tables {tables.shape} do not hold {pages.tolist()} pages")
    used = np.arange(tables.shape[1]) < pages[:, None]
    indptr = np.zeros(lens.size + 1, dtype=np.int32)
    np.cumsum(pages, out=indptr[1:])
    return PagedRows(indptr, tables[used].astype(np.int32, copy=False),
                     (lens - (pages - 1) * block_size).astype(np.int32))


def padded_graph_rows(ctx_lens: np.ndarray, tables: np.ndarray, size: int, block_size: int) -> PagedRows:
    """The rows of a decode graph of `size` sequences: the real ones, then padding rows of one token
    in block 0 (a plan needs a page per row; padding outputs are never read)."""
    n = ctx_lens.shape[0]
    lens = np.ones(size, dtype=np.int64)
    lens[:n] = ctx_lens
    padded = np.zeros((size, max(tables.shape[1], 1)), dtype=np.int32)
    padded[:n, :tables.shape[1]] = tables
    return paged_rows(lens, padded, block_size)


def check_supported(dtype: torch.dtype, head_dim: int) -> None:
    if dtype not in DTYPES:
        raise ConfigError(f"attention_backend='flashinfer' runs bf16 and fp16 (its fa2 kernels), not "
                          f"{str(dtype).removeprefix('torch.')}: use --dtype bfloat16 or --attention-backend triton")
    if head_dim not in HEAD_DIMS:
        raise ConfigError(f"attention_backend='flashinfer' compiles head_dim {HEAD_DIMS}, the model's is {head_dim}: "
                          "use --attention-backend triton")


class FlashInferAttention:
    """The model's attention callable on FlashInfer, and the runner's step planner."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                 device: torch.device):
        check_supported(dtype, head_dim)
        import flashinfer  # optional: only engines on this backend import it

        from raypd.engine.gpu import paged_attention  # write_kv: the pool's layout is raypd's
        self._fi = flashinfer
        self._write_kv = paged_attention.write_kv
        self.shape = dict(num_qo_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=block_size)
        self.block_size = block_size
        self.dtype = dtype
        self.device = device
        self.scale = head_dim ** -0.5  # as transformers' Llama
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.tensor_cores = num_heads // num_kv_heads >= TENSOR_CORE_MIN_GROUP
        self.eager_decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "HND", use_tensor_cores=self.tensor_cores, backend="fa2")
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "HND", backend="fa2")
        self.graph_decodes: dict[int, Any] = {}  # batch size -> its graph's wrapper
        self._decode: Any = self.eager_decode     # the wrapper this forward's decode rows run on
        self._has_prefill = False

    def _plan_kwargs(self) -> dict[str, Any]:
        return dict(q_data_type=self.dtype, kv_data_type=self.dtype, sm_scale=self.scale)

    def _plan_decode(self, wrapper: Any, rows: PagedRows) -> None:
        wrapper.plan(torch.from_numpy(rows.indptr), torch.from_numpy(rows.indices),
                     torch.from_numpy(rows.last_page_len), **self.shape, **self._plan_kwargs())

    def plan_step(self, decode_ctx_lens: np.ndarray | None, decode_tables: np.ndarray | None,
                  chunk_lens: list[int], chunk_starts: list[int], chunk_tables: list[np.ndarray]) -> None:
        """Plan an eager step: its decode rows (context lengths, block tables) and prefill chunks
        (lengths, start positions, block tables)."""
        self._decode = self.eager_decode
        if decode_ctx_lens is not None and decode_tables is not None:
            self._plan_decode(self.eager_decode, paged_rows(decode_ctx_lens, decode_tables, self.block_size))
        self._has_prefill = bool(chunk_lens)
        if chunk_lens:
            width = max(len(t) for t in chunk_tables)
            tables = np.zeros((len(chunk_tables), width), dtype=np.int32)
            for i, t in enumerate(chunk_tables):
                tables[i, :len(t)] = t
            lens = np.asarray(chunk_lens, dtype=np.int64)
            rows = paged_rows(np.asarray(chunk_starts, dtype=np.int64) + lens, tables, self.block_size)
            qo = np.zeros(lens.size + 1, dtype=np.int32)
            np.cumsum(lens, out=qo[1:])
            self.prefill.plan(torch.from_numpy(qo), torch.from_numpy(rows.indptr), torch.from_numpy(rows.indices),
                              torch.from_numpy(rows.last_page_len), self.shape["num_qo_heads"],
                              self.shape["num_kv_heads"], self.shape["head_dim"], self.block_size, causal=True,
                              **self._plan_kwargs())

    def plan_graph(self, size: int, ctx_lens: np.ndarray, tables: np.ndarray) -> None:
        """Plan the decode graph of `size` sequences for this step's rows (before its replay)."""
        self._plan_decode(self.graph_decodes[size], padded_graph_rows(ctx_lens, tables, size, self.block_size))

    def use_graph(self, size: int, max_blocks: int) -> None:
        """Point the decode rows at the graph wrapper of `size`, made and planned (one token per row)
        on first use: the capture's warm-up run, outside the capture."""
        wrapper = self.graph_decodes.get(size)
        if wrapper is None:
            dev = self.device
            wrapper = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "HND", use_cuda_graph=True, use_tensor_cores=self.tensor_cores, backend="fa2",
                paged_kv_indptr_buffer=torch.zeros(size + 1, dtype=torch.int32, device=dev),
                paged_kv_indices_buffer=torch.zeros(size * max_blocks, dtype=torch.int32, device=dev),
                paged_kv_last_page_len_buffer=torch.zeros(size, dtype=torch.int32, device=dev))
            self.graph_decodes[size] = wrapper
            self._plan_decode(wrapper, padded_graph_rows(np.zeros(0, np.int64), np.zeros((0, 1), np.int32), size,
                                                         self.block_size))
        self._decode = wrapper
        self._has_prefill = False

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: PagedKVCache,
                 meta: TritonAttentionMetadata) -> torch.Tensor:
        self._write_kv(kv.pool, layer, k, v, meta.slots)
        cache = kv.pool[:, layer]  # [block, K/V, kv_head, slot, head_dim]: FlashInfer's HND pages
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        d = meta.num_decode
        if d:
            self._decode.run(q[:d], cache, out=out[:d])
        if meta.prefill is not None:
            assert self._has_prefill, "a prefill chunk in a step that was not planned with it"
            self.prefill.run(q[d:], cache, out=out[d:])
        return out
