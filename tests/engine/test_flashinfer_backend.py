"""The flashinfer attention backend on the CPU: choosing it, the pages it plans, and the runner's
planning around every eager step and graph replay. FlashInfer itself needs CUDA, so its kernels are
stood in for by FakeFlashInfer, which computes in torch what they compute from what plan() gave
them (pages in CSR form, causal from each chunk's end, graph wrappers reading their own fixed
buffers). The tokens must be the torch path's: a wrong indptr, page, last-page length or causal
offset changes them. The real kernels are checked on a GPU (`raypd bench parity --attention-backend
flashinfer`, docs/benchmarks.md)."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from raypd.engine import LLM, ConfigError
from raypd.engine.gpu import backend, flashinfer_attention
from raypd.engine.gpu.backend import choose_backend
from raypd.engine.gpu.cuda_graphs import DecodeGraphs
from raypd.engine.gpu.flashinfer_attention import padded_graph_rows, paged_rows
from raypd.engine.gpu.runner import CudaModelRunner
from tests.engine.test_gpu_runner import GREEDY, PROMPTS, FakeGraphFactory


@pytest.fixture(autouse=True)
def few_decode_splits(monkeypatch):
    from raypd.engine.gpu import paged_attention
    monkeypatch.setattr(paged_attention, "_DEFAULT_SMS", 4)  # as test_gpu_runner: fewer interpreted programs


def test_pages_in_csr_form_with_the_last_page_partly_filled():
    tables = np.array([[7, 3, 9, 0], [5, 0, 0, 0], [2, 4, 6, 8]], dtype=np.int32)
    rows = paged_rows(np.array([17, 1, 32]), tables, block_size=16)
    assert rows.indptr.tolist() == [0, 2, 3, 5]
    assert rows.indices.tolist() == [7, 3, 5, 2, 4]
    assert rows.last_page_len.tolist() == [1, 1, 16]
    with pytest.raises(ValueError, match="at least one token"):
        paged_rows(np.array([0]), tables[:1], 16)
    with pytest.raises(ValueError, match="do not hold"):
        paged_rows(np.array([65]), tables[:1], 16)


def test_a_graphs_padding_rows_hold_one_token_of_block_0():
    rows = padded_graph_rows(np.array([20, 3], dtype=np.int32), np.array([[4, 6], [9, 0]], dtype=np.int32), 4, 16)
    assert rows.indptr.tolist() == [0, 2, 3, 4, 5]
    assert rows.indices.tolist() == [4, 6, 9, 0, 0]
    assert rows.last_page_len.tolist() == [4, 3, 1, 1]


def test_flashinfer_is_chosen_only_when_asked_and_says_why_it_cannot_run(monkeypatch):
    with pytest.raises(ConfigError, match="run on CUDA, not cpu"):
        choose_backend("flashinfer", torch.device("cpu"))
    monkeypatch.setattr(backend.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install flashinfer-python"):
        choose_backend("flashinfer", torch.device("cuda"))
    monkeypatch.setattr(backend.importlib.util, "find_spec", lambda name: object())
    assert choose_backend("flashinfer", torch.device("cuda")).backend == "flashinfer"
    assert choose_backend("auto", torch.device("cuda")).backend == "triton"  # installed or not


def test_float32_and_unsupported_head_dims_are_config_errors():
    with pytest.raises(ConfigError, match="bf16 and fp16"):
        flashinfer_attention.check_supported(torch.float32, 64)
    with pytest.raises(ConfigError, match="head_dim"):
        flashinfer_attention.check_supported(torch.bfloat16, 16)
    flashinfer_attention.check_supported(torch.bfloat16, 128)


def test_the_cli_offers_every_backend_the_config_takes():
    from raypd.cluster.cli import engine_args
    from raypd.engine.config import BACKEND_CHOICES
    assert engine_args.BACKEND_CHOICES == BACKEND_CHOICES


# -- the runner's planning, against a stand-in for FlashInfer's kernels ------------------------------
def attend(q: torch.Tensor, cache: torch.Tensor, qo: list[int], indptr: list[int], indices: list[int],
           last: list[int], scale: float) -> torch.Tensor:
    """Causal attention of each sequence's query rows (aligned to its last keys) over its pages:
    cache is one layer of the pool, [block, K/V, kv_head, slot, head_dim] (HND pages)."""
    block_size, kvh = cache.shape[3], cache.shape[2]
    out = torch.zeros_like(q)
    for s in range(len(indptr) - 1):
        pages = torch.tensor(indices[indptr[s]:indptr[s + 1]])
        kv_len = (len(pages) - 1) * block_size + last[s]
        k, v = (cache[pages, i].permute(0, 2, 1, 3).reshape(-1, kvh, cache.shape[4])[:kv_len].float()
                for i in (0, 1))
        rows = q[qo[s]:qo[s + 1]].float()
        n, g = rows.shape[0], q.shape[1] // kvh
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        scores = torch.einsum("nhd,khd->hnk", rows, k) * scale
        visible = torch.arange(kv_len)[None, :] <= (kv_len - n + torch.arange(n))[:, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out[qo[s]:qo[s + 1]] = torch.einsum("hnk,khd->nhd", probs, v).to(q.dtype)
    return out


class FakeDecode:
    """FlashInfer's decode wrapper: plan() keeps the problem (a graph wrapper in its fixed buffers,
    whose batch size cannot change), run() computes it. Its signatures are FlashInfer's."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto"):
        assert kv_layout == "HND" and backend == "fa2"
        self.graph = use_cuda_graph
        self.buffers = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        self.plans = 0

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             q_data_type=None, kv_data_type=None, sm_scale=None):
        qo = torch.arange(len(indptr), dtype=torch.int32)
        self._keep(qo, indptr, indices, last_page_len, sm_scale)

    def _keep(self, qo, indptr, indices, last, sm_scale):
        assert all(t.dtype == torch.int32 and t.device.type == "cpu" for t in (qo, indptr, indices, last))
        if self.graph:
            b_indptr, b_indices, b_last = self.buffers
            assert len(indptr) == len(b_indptr), "a graph wrapper's batch size is fixed"
            b_indptr.copy_(indptr)
            b_indices[:len(indices)].copy_(indices)
            b_last.copy_(last)
            indptr, indices, last = b_indptr, b_indices, b_last
        self.problem = (qo, indptr, indices, last, sm_scale)
        self.plans += 1

    def run(self, q, paged_kv_cache, *, out):
        qo, indptr, indices, last, scale = self.problem
        assert q.shape[0] == int(qo[-1]), "run with the rows that were planned"
        out.copy_(attend(q, paged_kv_cache, qo.tolist(), indptr.tolist(), indices.tolist(), last.tolist(), scale))
        return out


class FakePrefill(FakeDecode):
    def __init__(self, float_workspace_buffer, kv_layout="NHD", backend="auto"):
        super().__init__(float_workspace_buffer, kv_layout, backend=backend)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, *, causal=False, q_data_type=None, kv_data_type=None,
             sm_scale=None):
        assert causal
        self._keep(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, sm_scale)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    module = types.ModuleType("flashinfer")
    module.BatchDecodeWithPagedKVCacheWrapper = FakeDecode
    module.BatchPrefillWithPagedKVCacheWrapper = FakePrefill
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setattr(backend, "flashinfer_unavailable", lambda device: None)
    # The tiny model is float32 with head_dim 16, which FlashInfer does not compile; the stand-in does.
    monkeypatch.setattr(flashinfer_attention, "DTYPES", (torch.float32,))
    monkeypatch.setattr(flashinfer_attention, "HEAD_DIMS", (16,))
    monkeypatch.setattr(flashinfer_attention, "WORKSPACE_BYTES", 16)


@pytest.fixture(scope="module")
def torch_reference(tiny_model_dir):
    llm = LLM(tiny_model_dir, attention_backend="torch", kv_cache_memory_mb=16)
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "fake-graphs"])
def test_planned_steps_give_the_torch_paths_tokens(fake_flashinfer, tiny_model_dir, torch_reference, graphs):
    # Small chunks and budget: steps mix decode rows with prefill chunks after a cached prefix.
    llm = LLM(tiny_model_dir, attention_backend="flashinfer", kv_cache_memory_mb=16, chunked_prefill_size=16,
              max_num_batched_tokens=24, max_running_requests=4)
    runner = llm.engine.runner
    assert isinstance(runner, CudaModelRunner) and runner.planner is not None
    planner = runner.planner
    assert isinstance(planner, flashinfer_attention.FlashInferAttention)
    if graphs:
        runner.graphs = DecodeGraphs(runner.decode_forward, 4, 16, torch.device("cpu"), FakeGraphFactory())
        assert sorted(planner.graph_decodes) == [1, 2, 4]  # made and planned once each, at capture
    first = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    again = llm.generate(PROMPTS, GREEDY)  # from the prefix cache: chunks start past a cached prefix
    assert first == torch_reference
    assert [o.token_ids for o in again] == torch_reference
    assert any(o.num_cached_tokens for o in again)
    if graphs:
        assert sum(w.plans for w in planner.graph_decodes.values()) > len(planner.graph_decodes)  # replays planned
        assert not runner.can_launch_ahead([])  # no overlap: see can_launch_ahead
    llm.engine.check_block_integrity()
