"""Overlap scheduling (engine/overlap.py) on the CPU: the CUDA runner with fake graphs (each replay
calls the captured forward again, the Triton kernels under the interpreter), so decode steps are
launched one ahead of the host as on a GPU. Whatever happens while a step is in flight (a stop
token, an abort, a retraction, a request that needs the host's sampler, max_tokens reached), each
request's tokens and finish reason must be the plain step's, and every block accounted for."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from raypd.engine import LLMEngine, SamplingParams
from raypd.engine.gpu.cuda_graphs import DecodeGraphs
from raypd.engine.gpu.runner import CudaModelRunner
from raypd.engine.overlap import PENDING
from tests.engine.test_gpu_runner import FakeGraphFactory, few_decode_splits  # noqa: F401  (fixture)

PROMPTS = [list(range(10, 15)), list(range(300, 341)), list(range(300, 330)) + [7, 7], [42, 43]]
OPTIONS = dict(attention_backend="triton", kv_cache_memory_mb=16, max_running_requests=4, chunked_prefill_size=32,
               max_num_batched_tokens=64)


def engine(tiny_model_dir: str, overlap: bool, **options) -> tuple[LLMEngine, list[int]]:
    """An engine on the CUDA runner with fake graphs; the list counts its overlapped launches."""
    eng = LLMEngine(tiny_model_dir, disable_overlap_schedule=not overlap, **(OPTIONS | options))
    runner = eng.runner
    assert isinstance(runner, CudaModelRunner)
    runner.graphs = DecodeGraphs(runner.decode_forward, eng.config.max_running_requests, 32, torch.device("cpu"),
                                 FakeGraphFactory())
    launches: list[int] = []
    launch = runner.launch_ahead

    def counted(items, previous):
        launches.append(len(items))
        return launch(items, previous)
    runner.launch_ahead = counted  # type: ignore[method-assign]
    return eng, launches


def run(eng: LLMEngine, params: list[SamplingParams], between: Callable[[LLMEngine, int], None] | None = None,
        ) -> dict[str, tuple[list[int], str | None]]:
    """Every prompt with its params, stepped to the end; between(engine, step) runs after each step."""
    for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
        eng.add_request(prompt, p, f"r{i}")
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(PROMPTS))}
    reasons: dict[str, str | None] = {}
    n = 0
    while eng.has_unfinished():
        for o in eng.step():
            assert PENDING not in o.new_token_ids
            tokens[o.request_id] += o.new_token_ids
            if o.finished:
                reasons[o.request_id] = o.finish_reason
        n += 1
        if between is not None:
            between(eng, n)
    eng.check_block_integrity()
    assert eng.block_accounting().held == 0
    return {rid: (toks, reasons.get(rid)) for rid, toks in tokens.items()}


def greedy(max_tokens: int = 12, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    """The plain step's results for the cases below (the same engine options, no overlap), each
    computed once: several cases compare with the same plain run (under Triton's interpreter a run
    takes seconds)."""
    done: dict[str, dict[str, tuple[list[int], str | None]]] = {}

    def results(params: list[SamplingParams], between=None, **options):
        key = repr((params, sorted(options.items())))
        if between is None and key in done:
            return done[key]
        eng, launches = engine(tiny_model_dir, overlap=False, **options)
        out = run(eng, params, between)
        assert launches == []
        if between is None:
            done[key] = out
        return out
    return results


def test_greedy_tokens_are_the_plain_steps_with_steps_launched_ahead(tiny_model_dir, plain):
    params = [greedy(8), greedy(3), greedy(6), greedy(10)]  # ends by length at different steps
    eng, launches = engine(tiny_model_dir, overlap=True)
    assert run(eng, params) == plain(params)
    assert len(launches) >= 8 and max(launches) == len(PROMPTS)


def test_a_stop_token_reached_while_the_next_step_is_in_flight(tiny_model_dir, plain):
    reference = plain([greedy(10)] * 4)
    # Each request stops at the 5th token of its greedy output: the step after it is already launched.
    params = [greedy(10, stop_token_ids=[reference[f"r{i}"][0][4]]) for i in range(4)]
    eng, launches = engine(tiny_model_dir, overlap=True)
    got = run(eng, params)
    assert got == plain(params)
    assert all(reason == "stop" and len(toks) <= 5 for toks, reason in got.values()) and launches


def test_an_abort_while_a_step_is_in_flight(tiny_model_dir, plain):
    aborted_in_flight = []

    def abort_r1(eng: LLMEngine, step: int) -> None:
        inflight = eng._inflight
        if not aborted_in_flight and inflight is not None and any(x.request.request_id == "r1" for x in inflight.items):
            aborted_in_flight.append(step)
            eng.abort("r1")
    params = [greedy(10)] * 4
    got = run(engine(tiny_model_dir, overlap=True)[0], params, abort_r1)
    want = plain(params)
    assert aborted_in_flight
    assert {k: v for k, v in got.items() if k != "r1"} == {k: v for k, v in want.items() if k != "r1"}
    tokens, reason = got["r1"]
    assert reason is None and tokens == want["r1"][0][:len(tokens)] and len(tokens) < 10


def test_retractions_while_steps_are_in_flight(tiny_model_dir, plain):
    # 14 blocks of 8 tokens: the four requests (17 blocks at their ends, the shared prefix of r1 and
    # r2 counted once) outgrow it together, and the newest is retracted.
    options = dict(num_blocks=14, block_size=8, init_new_token_ratio=0.0, min_new_token_ratio=0.0)
    params = [greedy(16)] * 4
    eng, launches = engine(tiny_model_dir, overlap=True, **options)
    got = run(eng, params)
    assert eng.scheduler.num_retractions > 0 and launches
    assert got == plain(params, **options)


def test_a_sampled_request_makes_its_steps_plain_and_keeps_its_draws(tiny_model_dir, plain):
    params = [greedy(10), SamplingParams(max_tokens=5, temperature=0.8, seed=7, ignore_eos=True), greedy(10),
              SamplingParams(max_tokens=3, temperature=0.0, repetition_penalty=1.3, ignore_eos=True)]
    eng, launches = engine(tiny_model_dir, overlap=True)
    assert run(eng, params) == plain(params)
    assert launches and max(launches) < 4  # overlapped only once the host-sampled requests were done
