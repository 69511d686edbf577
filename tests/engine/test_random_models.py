"""benchmarks/random_models.py: `--model random:NAME` builds a random-weight checkpoint once, in the
cache folder, that raypd and transformers both load and agree on (float32 greedy)."""
from __future__ import annotations

import pytest
import torch

from raypd.benchmarks import random_models
from raypd.benchmarks.random_models import SHAPES, resolve_bench_model
from raypd.engine import LLM, SamplingParams

TINY_SHAPE = dict(architecture="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                  rope_theta=1000000.0)


def test_a_random_checkpoint_is_built_once_and_loads_in_both(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYPD_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(SHAPES, "tiny-test", TINY_SHAPE)
    folder = resolve_bench_model("random:tiny-test")
    assert folder == tmp_path / "random" / "tiny-test-seed0" and (folder / "tokenizer.json").exists()
    built = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_bench_model("random:tiny-test") == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == built  # cached, not rebuilt

    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    prompt = list(range(100, 120))
    with torch.inference_mode():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=6, min_new_tokens=6, do_sample=False)[0, 20:].tolist()
    llm = LLM(str(folder), kv_cache_memory_mb=16)
    assert llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0].token_ids == want


def test_unknown_names_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="llama-1b"):
        random_models.resolve_bench_model("random:gpt-5")
