"""Model families beside Llama: Qwen2/Qwen2.5 (q/k/v biases), Qwen3 (q/k RMSNorm per head, head_dim
apart from hidden/heads) and Llama-3.x (llama3 rope scaling, GQA, untied head). Each is a tiny
random checkpoint built with transformers' own config and model classes and saved as a Hugging Face
folder (nothing downloaded); raypd's greedy tokens must equal transformers' in float32: with chunked
prefill, again from the prefix cache, and through a prefill node and a decode node that hand the KV
over through the real node stages. Real configs of the models users serve (pinned below) are accepted."""
from __future__ import annotations

import asyncio

import pytest
import torch

from raypd.benchmarks.family_parity import PROMPTS, hf_greedy
from raypd.benchmarks.random_models import copy_tokenizer, tiny_family
from raypd.decode_node.decode_node import DecodeNode
from raypd.engine import LLM, SamplingParams
from raypd.engine.errors import UnsupportedModelError
from raypd.engine.model.config import ModelConfig
from raypd.prefill_node.prefill_node import PrefillNode
from tests.node.pd import PATIENT, TokenSink, assert_idle, request, stop_nodes

NEW = 16
GREEDY = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
FAMILIES = ("qwen2", "qwen3", "llama3")  # built by benchmarks/random_models.py's tiny_family


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory, llm):
    """(folder, greedy reference per prompt) for one family."""
    ref = tiny_family(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(folder)
    copy_tokenizer(llm.engine.model_dir, folder)
    return folder, hf_greedy(ref, torch.device("cpu"), torch.float32, NEW)


def test_greedy_equals_transformers_chunked_then_from_the_prefix_cache(family):
    folder, want = family
    llm = LLM(model=str(folder), block_size=8, chunked_prefill_size=16)
    cold = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in cold] == want
    warm = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in warm] == want
    assert warm[1].num_cached_tokens >= 96  # the 100-token prompt came back from the radix cache
    llm.engine.check_block_integrity()


def test_greedy_equals_transformers_through_a_prefill_and_a_decode_node(family):
    folder, want = family
    engine = {"num_blocks": 64, "block_size": 8, "chunked_prefill_size": 32}
    prefill = PrefillNode("fam-prefill", model=str(folder), engine_options=engine, transfer_options=PATIENT, aux_slots=4)
    decode = DecodeNode("fam-decode", model=str(folder), engine_options=engine, transfer_options=PATIENT, aux_slots=4)
    sink = TokenSink()
    try:
        reqs = [request(ids, GREEDY, prefill.duty.sender.bootstrap_address, sink.address) for ids in PROMPTS]

        async def main():
            await asyncio.gather(prefill.ready(), decode.ready())
            return await asyncio.gather(*(prefill.prefill(r) for r in reqs), *(decode.generate(r) for r in reqs))
        results = asyncio.run(main())
        assert all(res.ok for res in results[:len(reqs)]), results[:len(reqs)]
        got = [[t for c in sink.chunks(r.request_id) for t in c.token_ids] for r in reqs]
        assert got == want
        asyncio.run(assert_idle(prefill, decode))
    finally:
        sink.close()
        stop_nodes(prefill, decode)


# config.json of the models users serve, as published (trimmed of keys the loader ignores).
QWEN25_7B_INSTRUCT = {  # docs/deploy.md's example
    "architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
    "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 32768, "max_window_layers": 28,
    "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 152064}
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "bos_token_id": 151643, "eos_token_id": 151645,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32,
    "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False, "use_sliding_window": False,
    "vocab_size": 151936}
LLAMA31_8B_INSTRUCT = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256}


def test_the_published_configs_load_with_their_family_switches():
    qwen25 = ModelConfig.from_hf(QWEN25_7B_INSTRUCT)
    assert qwen25.attention_bias and not qwen25.qk_norm and qwen25.head_dim == 128 and qwen25.num_kv_heads == 4
    qwen3_8b = ModelConfig.from_hf(QWEN3_8B)
    assert qwen3_8b.qk_norm and not qwen3_8b.attention_bias and qwen3_8b.head_dim == 128
    llama31 = ModelConfig.from_hf(LLAMA31_8B_INSTRUCT)
    assert llama31.rope_scaling is not None and llama31.rope_scaling["rope_type"] == "llama3"
    assert llama31.eos_token_ids == (128001, 128008, 128009) and not llama31.attention_bias


def test_real_sliding_windows_and_unknown_families_are_refused():
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        ModelConfig.from_hf({**QWEN25_7B_INSTRUCT, "use_sliding_window": True, "sliding_window": 4096,
                             "max_window_layers": 20})
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        ModelConfig.from_hf({**QWEN3_8B, "layer_types": ["full_attention", "sliding_attention"]})
    with pytest.raises(UnsupportedModelError, match="Gemma2ForCausalLM"):
        ModelConfig.from_hf({**QWEN3_8B, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2"})
