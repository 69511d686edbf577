"""A tiny random-weight Llama with the default model's tokenizer and chat template, built in the
test run (nothing downloaded), for tests about serving, routing, failures and accounting rather than
about the real model's tokens: an engine on it starts and steps in milliseconds, where the 135 M
default spends seconds per request on this CPU. Parity with transformers on real weights stays
with the default model (tests/engine/test_parity.py, and across nodes the one cluster test module
that compares with hf_reference: tests/cluster/test_conductor_routing.py, whose request goes from
prefill to decode node, is served from a cache hit and from a prefix copied between prefill nodes)."""
from __future__ import annotations

from pathlib import Path

# The default model's vocabulary (so its tokenizer and chat template serve this model) and a body
# of 2 layers of width 64: ~3 M parameters, nearly all of them the embedding.
TINY = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2048, initializer_range=0.3, bos_token_id=1,
            eos_token_id=2, tie_word_embeddings=True, rope_theta=10000.0)


def build_tiny_llama(folder: Path, seed: int = 0) -> Path:
    """Save a tiny random Llama into `folder` (a Hugging Face folder raypd and transformers load)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from raypd.benchmarks.random_models import copy_tokenizer
    from raypd.engine.model.source import resolve_model

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    copy_tokenizer(resolve_model(None), folder)
    return folder
