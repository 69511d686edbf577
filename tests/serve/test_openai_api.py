"""The OpenAI API of `raypd serve` through the official openai client: chat and completions,
streaming and not, stop strings and stop token ids, max_tokens, seeds, n, echo, usage with cached
tokens, and greedy output equal to the single-process engine (itself tested equal to transformers)."""
from __future__ import annotations

import pytest

from raypd.protocol.sampling_params import SamplingParams
from tests.prompts import ARTICLE
from tests.serve.conftest import DEFAULT_MAX_TOKENS, MODEL, node_report, replicas_answering, wait_nodes_idle

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

CHAT = [{"role": "user", "content": "Write a short poem about the sea."}]
PROMPT = "Once upon a time, in a village at the edge of a great forest, there lived"
N = 24


@pytest.fixture(scope="module")
def reference(llm):
    """The single-process engine's greedy outputs: {name: CompletionOutput}."""
    greedy = SamplingParams(max_tokens=N, temperature=0.0)
    outs = llm.generate([PROMPT, {"messages": CHAT}], greedy)
    return {"prompt": outs[0], "chat": outs[1]}


def stream_text(stream) -> tuple[str, str | None, list[str]]:
    deltas, reason = [], None
    for chunk in stream:
        for choice in chunk.choices:
            text = choice.delta.content if hasattr(choice, "delta") else choice.text
            if text:
                deltas.append(text)
            reason = choice.finish_reason or reason
    return "".join(deltas), reason, deltas


def test_models_and_health(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    nodes = node_report(server.port)
    assert sorted(n["role"] for n in nodes) == ["decode", "prefill"]


def test_chat_greedy_equals_engine(client, reference):
    ref = reference["chat"]
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=N, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].finish_reason == ("stop" if len(ref.token_ids) < N else "length")
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_equals_non_stream(client, reference):
    ref = reference["chat"]
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=N, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        ["stop" if len(ref.token_ids) < N else "length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)


def test_completion_greedy_equals_engine_streaming_and_not(client, reference):
    ref = reference["prompt"]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text == ref.text
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids) and r.usage.completion_tokens == len(ref.token_ids)
    text, reason, deltas = stream_text(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N,
                                                                 temperature=0, stream=True))
    assert text == ref.text and reason == r.choices[0].finish_reason
    assert len(deltas) > 1  # it really streamed


def test_token_id_prompt_and_batch(client, reference):
    ref = reference["prompt"]
    for prompt in ([list(ref.prompt_token_ids)] * 2, [PROMPT, PROMPT]):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=N, temperature=0)
        assert [c.index for c in r.choices] == [0, 1]
        assert [c.text for c in r.choices] == [ref.text, ref.text]
        assert r.usage.prompt_tokens == 2 * len(ref.prompt_token_ids)


def test_stop_string_cuts_output_streaming_and_not(client, reference):
    full = reference["prompt"].text
    stop = full[len(full) // 2: len(full) // 2 + 6]  # likely spans a token boundary
    expected = full[:full.index(stop)]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0, stop=[stop, "zzzz"])
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < len(reference["prompt"].token_ids)
    text, reason, deltas = stream_text(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N,
                                                                 temperature=0, stop=stop, stream=True))
    assert text == expected and reason == "stop"


def test_stop_token_id_ends_before_that_token(client, llm, reference):
    ref = reference["prompt"]
    third = ref.token_ids[2]
    first = ref.token_ids.index(third)  # the first occurrence ends the output
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0,
                                  extra_body={"stop_token_ids": [third]})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == first + 1
    assert r.choices[0].text == llm.tokenizer.decode(ref.token_ids[:first])


def test_max_tokens_and_max_completion_tokens(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    # No max_tokens: the server's default cap (--default-max-tokens) applies.
    r = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == DEFAULT_MAX_TOKENS


def test_seeded_sampling_is_reproducible_and_n_fans_out(client):
    kw = dict(model=MODEL, messages=CHAT, max_tokens=16, temperature=1.0, top_p=0.95, seed=1234)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    many = client.chat.completions.create(n=3, **kw)
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert many.choices[0].message.content == a.choices[0].message.content  # choice j samples with seed + j
    assert 3 <= many.usage.completion_tokens <= 3 * 16
    again = client.chat.completions.create(n=3, **kw)
    assert [c.message.content for c in again.choices] == [c.message.content for c in many.choices]
    stream = client.chat.completions.create(n=3, stream=True, **kw)
    texts = {0: "", 1: "", 2: ""}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert [texts[i] for i in range(3)] == [c.message.content for c in many.choices]


def test_echo_prepends_the_prompt(client, reference):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0, echo=True)
    assert r.choices[0].text == PROMPT + reference["prompt"].text


def test_repeated_prompt_reports_cached_tokens(client, server):
    messages = [{"role": "user", "content": "Summarise in one sentence:\n" + ARTICLE[:600]}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    n = second.usage.prompt_tokens
    assert first.usage.prompt_tokens == n > 32
    # Everything but the block holding the last prompt token comes from the prefill node's cache.
    assert second.usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16 > 0
    assert second.choices[0].message.content == first.choices[0].message.content
    wait_nodes_idle(server.port)


def test_replicas_share_the_load(client):
    assert len(replicas_answering(client)) == 2
