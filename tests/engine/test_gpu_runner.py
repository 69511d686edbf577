"""engine/gpu on the CPU: the runner that orders decode rows before prefill chunks and feeds the
Triton kernels (run by Triton's interpreter here), and the CUDA-graph buckets with their padding
(a fake graph that calls the captured function again). The tokens must be the torch path's."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from raypd.engine import LLM, SamplingParams
from raypd.engine.gpu.cuda_graphs import DecodeGraphs, DecodeHostRows, DecodeInputs, bucket_for, graph_batch_sizes
from raypd.engine.gpu.runner import CudaModelRunner


@pytest.fixture(autouse=True)
def few_decode_splits(monkeypatch):
    """Split decode attention as for a GPU of 4 SMs: Triton's interpreter runs every program in
    Python, and the splits a 132-SM GPU would get only multiply them (the kernel tests cover splits)."""
    from raypd.engine.gpu import paged_attention
    monkeypatch.setattr(paged_attention, "_DEFAULT_SMS", 4)


GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = [list(range(10, 15)), list(range(300, 371)), list(range(300, 340)) + [7, 7, 7], [42]]


class FakeStep:
    def __init__(self, fn: Callable[[], torch.Tensor], out: torch.Tensor):
        self.fn, self.out, self.replays = fn, out, 0

    def replay(self) -> None:
        self.replays += 1
        self.out.copy_(self.fn())


class FakeGraphFactory:
    """Capture = call once; replay = call again into the same output tensor."""

    def __init__(self) -> None:
        self.steps: list[FakeStep] = []

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[FakeStep, torch.Tensor]:
        out = fn().clone()
        self.steps.append(FakeStep(fn, out))
        return self.steps[-1], out


def test_graph_batch_sizes_cover_every_batch_up_to_the_limit():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(10) == [1, 2, 4, 8, 10]
    sizes = graph_batch_sizes(256)
    assert sizes[:11] == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert sizes[11:] == list(range(80, 257, 16))
    assert graph_batch_sizes(70) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 70]
    assert [bucket_for(n, sizes) for n in (1, 3, 9, 64, 65, 250, 256, 257)] == [1, 4, 16, 64, 80, 256, 256, None]


def test_replay_pads_the_bucket_and_copies_only_the_real_rows():
    seen: list[DecodeInputs] = []

    def forward(inputs: DecodeInputs) -> torch.Tensor:
        seen.append(DecodeInputs(*(t.clone() for t in (inputs.input_ids, inputs.positions, inputs.slots,
                                                           inputs.ctx_lens, inputs.tables))))
        return inputs.input_ids.float()[:, None] * torch.ones(1, 3)

    factory = FakeGraphFactory()
    graphs = DecodeGraphs(forward, max_batch=10, max_blocks=4, device=torch.device("cpu"), factory=factory)
    assert graphs.sizes == [1, 2, 4, 8, 10] and len(factory.steps) == 5
    assert graphs.serves(10, 4) and not graphs.serves(11, 4) and not graphs.serves(3, 5)
    seen.clear()
    rows = DecodeHostRows(np.array([5, 6, 7]), np.array([20, 3, 40]), np.array([100, 33, 71]),
                          np.array([21, 4, 41], dtype=np.int32), np.array([[6, 2], [2, 0], [4, 1]], dtype=np.int32))
    logits = graphs.run(rows)
    (step,) = seen  # the bucket of 4 replayed, once
    assert step.input_ids.tolist() == [5, 6, 7, 0] and step.positions.tolist() == [20, 3, 40, 0]
    assert step.slots.tolist() == [100, 33, 71, -1] and step.ctx_lens.tolist() == [21, 4, 41, 0]
    assert step.tables[:3, :2].tolist() == [[6, 2], [2, 0], [4, 1]] and step.tables[3].tolist() == [0, 0, 0, 0]
    assert logits.shape == (3, 3) and logits[:, 0].tolist() == [5.0, 6.0, 7.0]


@pytest.fixture(scope="module")
def torch_reference(tiny_model_dir):
    llm = LLM(tiny_model_dir, attention_backend="torch", kv_cache_memory_mb=16)
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "fake-graphs"])
def test_triton_path_matches_the_torch_path(tiny_model_dir, torch_reference, graphs):
    # Small chunks and budget: steps mix decode rows with prefill chunks after a cached prefix.
    llm = LLM(tiny_model_dir, attention_backend="triton", kv_cache_memory_mb=16, chunked_prefill_size=16,
              max_num_batched_tokens=24, max_running_requests=4)
    runner = llm.engine.runner
    assert isinstance(runner, CudaModelRunner)
    if graphs:
        runner.graphs = DecodeGraphs(runner.decode_forward, 4, 16, torch.device("cpu"), FakeGraphFactory())
    first = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    again = llm.generate(PROMPTS, GREEDY)  # from the prefix cache: chunks start past a cached prefix
    assert first == torch_reference
    assert [o.token_ids for o in again] == torch_reference
    assert any(o.num_cached_tokens for o in again)
    llm.engine.check_block_integrity()
