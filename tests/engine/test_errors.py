"""Bad input gets a typed error with a clear message, and leaves the engine clean."""
from __future__ import annotations

import json

import pytest

from raypd.engine import LLM, ConfigError, InvalidRequestError, ModelLoadError, SamplingParams, UnsupportedModelError


@pytest.mark.parametrize("prompt, param, words", [
    ([], "prompt", "empty"),
    ("", "prompt", "empty"),
    ([1, 2, 49152], "prompt", "outside the vocabulary"),
    ([1, -3], "prompt", "outside the vocabulary"),
    ([1, 2.5], "prompt", "outside the vocabulary"),
    (list(range(8192)), "prompt", "context length"),
])
def test_bad_prompts(llm, prompt, param, words):
    with pytest.raises(InvalidRequestError) as e:
        llm.generate([prompt], SamplingParams(max_tokens=4))
    assert e.value.param == param and words in str(e.value)


def test_request_larger_than_the_cache(make_llm):
    llm = make_llm(num_blocks=4, block_size=16)
    with pytest.raises(InvalidRequestError, match="KV blocks"):
        llm.generate([list(range(100, 160))], SamplingParams(max_tokens=8))
    assert llm.generate([list(range(100, 150))], SamplingParams(max_tokens=8, temperature=0))[0].finish_reason


def test_validate_checks_without_adding(make_llm):
    eng = make_llm(num_blocks=4, block_size=16).engine
    params = SamplingParams(max_tokens=8)
    assert eng.validate([5, 6, 7], params) == [5, 6, 7] and not eng.requests
    with pytest.raises(InvalidRequestError, match="KV blocks"):
        eng.validate(list(range(100, 160)), params)  # 68 tokens need 5 blocks
    # A prefill-only request needs room for its prompt and one token, not for max_tokens.
    assert len(eng.validate(list(range(100, 160)), params, prefill_only=True)) == 60
    assert not eng.requests


def test_one_bad_prompt_in_a_batch_leaves_nothing_behind(llm):
    with pytest.raises(InvalidRequestError):
        llm.generate(["fine", [999999]], SamplingParams(max_tokens=4))
    assert not llm.engine.requests and not llm.engine.has_unfinished()


def test_duplicate_request_id(llm):
    eng = llm.engine
    eng.add_request([1, 2, 3], SamplingParams(max_tokens=2), request_id="dup")
    try:
        with pytest.raises(InvalidRequestError, match="duplicate"):
            eng.add_request([1, 2, 3], SamplingParams(max_tokens=2), request_id="dup")
    finally:
        eng.abort("dup")


def test_missing_model_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        LLM(model=str(tmp_path / "nope"))


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        LLM(model=str(tmp_path))


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        LLM(model=str(tmp_path))


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError):
        LLM(model=str(bad))


@pytest.mark.parametrize("options", [{"block_size": 0}, {"num_blocks": 0}, {"schedule_policy": "random"},
                                     {"dtype": "int8"}, {"max_num_batched_tokens": 0}])
def test_bad_engine_options(options):
    with pytest.raises(ConfigError):
        LLM(**options)
