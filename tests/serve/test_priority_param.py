"""The OpenAI `priority` extension (vLLM's: an integer, lower is more urgent): it reaches every
choice's SamplingParams, 0 when unset; what is not an integer in range answers 400 (test_errors.py)."""
from __future__ import annotations

from raypd.cluster.openai.params import ModelLimits, prepare
from raypd.cluster.openai.request_schema import ChatCompletionRequest, CompletionRequest

LIMITS = ModelLimits(name="m", context_len=8192, vocab_size=49152, block_size=16, decode_kv_tokens=4096,
                     prefill_kv_tokens=4096)


def test_priority_reaches_every_choice_and_is_0_when_unset():
    urgent = CompletionRequest(model="m", prompt=[1, 2, 3], max_tokens=2, n=2, priority=-3)
    assert [j.params.priority for j in prepare(urgent, [[1, 2, 3], [4, 5]], LIMITS).jobs] == [-3] * 4
    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert [j.params.priority for j in prepare(chat, [[1, 2, 3]], LIMITS).jobs] == [0]
