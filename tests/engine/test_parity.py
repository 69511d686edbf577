"""Greedy output equals Hugging Face transformers token for token, in every scheduling mode.

The default model (its GGUF dequantized, on the CPU fast path and on plain torch kernels) against
transformers on the same GGUF: the real model's tokens. The scheduling modes (one at a time, a warm
prefix cache, chunked prefill, eviction and retraction, the other policies, a prefix shared within
a batch) decide which tokens each forward pass computes and which blocks it reads, whatever the
weights: they run on the tiny random model (tests/tiny_model.py) against transformers on that same
model, where an engine steps in milliseconds instead of seconds."""
from __future__ import annotations

import pytest

from raypd.engine import SamplingParams
from tests.conftest import NEW_TOKENS

GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)


def assert_same(outputs, reference):
    for i, (out, ref) in enumerate(zip(outputs, reference, strict=True)):
        assert out.token_ids == ref, f"prompt {i}: engine {out.token_ids} != transformers {ref}"
        assert out.finish_reason == ("stop" if len(ref) < NEW_TOKENS else "length")


def test_all_prompts_together(make_llm, prompt_ids, hf_reference):
    llm = make_llm()
    # The default on a CPU box is the fast path; a silent fallback to torch would go unnoticed here.
    assert llm.engine.decode_kernel is not None and llm.engine.model.lm_head.packed
    assert_same(llm.generate(prompt_ids, GREEDY), hf_reference)


def test_one_prompt_at_a_time(make_llm, tiny_model_dir, prompt_ids, tiny_reference):
    llm = make_llm(model=tiny_model_dir, enable_prefix_cache=False)
    assert_same([llm.generate([ids], GREEDY)[0] for ids in prompt_ids], tiny_reference)


def test_warm_prefix_cache(make_llm, tiny_model_dir, prompt_ids, tiny_reference):
    llm = make_llm(model=tiny_model_dir, max_running_requests=4)  # its own engine, so the first pass starts cold
    first = llm.generate(prompt_ids, GREEDY)
    second = llm.generate(prompt_ids, GREEDY)
    assert_same(first, tiny_reference)
    assert_same(second, tiny_reference)
    bs = llm.engine.config.block_size
    for ids, out in zip(prompt_ids, second):
        # Everything but the block holding the last prompt token is served from cache.
        assert out.num_cached_tokens == (len(ids) - 1) // bs * bs


def test_chunked_prefill(make_llm, tiny_model_dir, prompt_ids, tiny_reference):
    llm = make_llm(model=tiny_model_dir, chunked_prefill_size=32, max_num_batched_tokens=64)
    assert_same(llm.generate(prompt_ids, GREEDY), tiny_reference)


def test_eviction_and_retraction(make_llm, tiny_model_dir, prompt_ids, tiny_reference):
    # Enough blocks for the longest request alone, far too few for all of them at once.
    longest = max(len(ids) for ids in prompt_ids) + NEW_TOKENS
    llm = make_llm(model=tiny_model_dir, num_blocks=-(-longest // 16) + 6, chunked_prefill_size=64)
    assert_same(llm.generate(prompt_ids, GREEDY), tiny_reference)
    stats = llm.engine.stats()
    assert stats["num_retractions"] > 0
    assert stats["num_evicted_blocks"] > 0


@pytest.mark.parametrize("options", [{"schedule_policy": "lpm"}, {"enable_prefix_cache": False, "chunked_prefill_size": 0}])
def test_other_policies(make_llm, tiny_model_dir, prompt_ids, tiny_reference, options):
    assert_same(make_llm(model=tiny_model_dir, **options).generate(prompt_ids, GREEDY), tiny_reference)


def test_shared_prefix_is_reused_within_one_batch(make_llm, tiny_model_dir, prompt_ids, tiny_reference):
    # The two article questions share ~400 tokens; with one request admitted per step the second
    # finds the first's prompt blocks already published.
    llm = make_llm(model=tiny_model_dir, max_running_requests=1)
    outs = llm.generate(prompt_ids[5:7], GREEDY)
    assert_same(outs, tiny_reference[5:7])
    assert outs[1].num_cached_tokens >= 300


def test_plain_torch_kernels(make_llm, prompt_ids, hf_reference):
    # The path GPUs and non-float32 pools take: F.linear and gathered SDPA instead of the CPU kernels.
    llm = make_llm(cpu_kernels="torch")
    assert llm.engine.decode_kernel is None and not llm.engine.model.lm_head.packed
    assert_same(llm.generate(prompt_ids, GREEDY), hf_reference)
