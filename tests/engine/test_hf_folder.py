"""Hugging Face folders: a small random Llama with an untied head, GQA and llama3/linear rope
scaling matches transformers; the converted default folder loads as a plain folder."""
from __future__ import annotations

import shutil

import pytest
import torch

from raypd.engine import LLM, SamplingParams

ROPES = {
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "linear": {"rope_type": "linear", "rope_theta": 50000.0, "factor": 2.0},
}


@pytest.fixture(scope="module")
def tokenizer_dir(llm):
    return llm.engine.model_dir


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_random_llama_folder_matches_transformers(tmp_path, tokenizer_dir, rope):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_parameters=ROPES[rope], tie_word_embeddings=False, initializer_range=0.3,
                      bos_token_id=1, eos_token_id=2)
    ref = LlamaForCausalLM(cfg).eval()
    ref.save_pretrained(tmp_path)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_dir / f).exists():
            shutil.copy(tokenizer_dir / f, tmp_path / f)

    llm = LLM(model=str(tmp_path), block_size=8, chunked_prefill_size=16)
    prompts = [list(range(10, 15)), list(range(300, 400)), list(range(300, 380)) + [7, 7, 7]]
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    with torch.inference_mode():
        for ids, out in zip(prompts, outs):
            gen = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               max_new_tokens=24, min_new_tokens=24, do_sample=False)
            assert out.token_ids == gen[0, len(ids):].tolist()
    llm.engine.check_block_integrity()


def test_converted_default_loads_as_a_folder(llm):
    folder = LLM(model=str(llm.engine.model_dir))
    p = SamplingParams(max_tokens=12, temperature=0.0)
    assert folder.generate(["The capital of France is"], p)[0].token_ids == \
        llm.generate(["The capital of France is"], p)[0].token_ids


def test_bfloat16_runs(make_llm):
    out = make_llm(dtype="bfloat16").generate(["The capital of France is"], SamplingParams(max_tokens=12, temperature=0.0,
                                                                                             ignore_eos=True))[0]
    assert len(out.token_ids) == 12 and out.text
