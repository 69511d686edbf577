"""Failover replay: a request re-submitted to another engine as prompt + the k tokens already
streamed, with max_tokens reduced by k and num_replayed_tokens=k, continues the very stream the
uninterrupted run produces, seeded sampling and penalties included. Seeded sampling is the engines'
bookkeeping of positions and seeds, whatever the weights: it runs on the tiny random model
(tests/tiny_model.py), where a request takes milliseconds instead of seconds. The penalties stay on
the default model: the tiny model's sampled streams never repeat a token (checked while moving these
tests), so a penalty there would change nothing and prove nothing."""
from __future__ import annotations

from dataclasses import replace

import pytest

from raypd.engine import InvalidRequestError, SamplingParams

N = 16
SAMPLED = SamplingParams(max_tokens=N, temperature=0.9, top_p=0.95, ignore_eos=True)
PENALIZED = replace(SAMPLED, presence_penalty=1.2, frequency_penalty=0.8, repetition_penalty=1.1)
CUTS = (1, 2, 7, N - 1)


def _seeded(params: SamplingParams, n: int) -> list[SamplingParams]:
    return [replace(params, seed=500 + i) for i in range(n)]


def _replay(llm, prompts: list[list[int]], heads: list[list[int]], params: list[SamplingParams],
            count_replayed: bool = True) -> list[list[int]]:
    """What the ingress re-submits after a failure: prompt + head as the prompt, the rest of max_tokens."""
    k = len(heads[0])
    again = [replace(p, max_tokens=p.max_tokens - k, num_replayed_tokens=k if count_replayed else 0) for p in params]
    return [o.token_ids for o in llm.generate([ids + h for ids, h in zip(prompts, heads)], again)]


@pytest.mark.parametrize("base, tiny", [(SAMPLED, True), (PENALIZED, False)], ids=["sampled", "penalties"])
def test_replay_continues_the_uninterrupted_stream(make_llm, request, prompt_ids, base, tiny):
    model = {"model": request.getfixturevalue("tiny_model_dir")} if tiny else {}
    prompts = prompt_ids[1:6]
    params = _seeded(base, len(prompts))
    whole = [o.token_ids for o in make_llm(**model).generate(prompts, params)]
    assert all(len(w) == N for w in whole) and len({tuple(w) for w in whole}) == len(whole)
    first, other = make_llm(**model), make_llm(**model, max_running_requests=5)  # the replay runs on another engine
    for k in CUTS:
        heads = [o.token_ids for o in first.generate(prompts, [replace(p, max_tokens=k) for p in params])]
        assert heads == [w[:k] for w in whole]
        tails = _replay(other, prompts, heads, params)
        assert [h + t for h, t in zip(heads, tails)] == whole, k


def test_penalties_need_num_replayed_tokens_to_continue(make_llm, prompt_ids):
    # The control for the test above: the penalties do change the output, and a replay that counts
    # the replayed tokens as prompt (num_replayed_tokens=0) penalizes differently.
    prompts = prompt_ids[1:6]
    params = _seeded(PENALIZED, len(prompts))
    llm = make_llm()
    whole = [o.token_ids for o in llm.generate(prompts, params)]
    assert whole != [o.token_ids for o in llm.generate(prompts, _seeded(SAMPLED, len(prompts)))]
    k = 7
    heads = [w[:k] for w in whole]
    assert [h + t for h, t in zip(heads, _replay(llm, prompts, heads, params))] == whole
    assert [h + t for h, t in zip(heads, _replay(llm, prompts, heads, params, count_replayed=False))] != whole


def test_num_replayed_tokens_must_be_shorter_than_the_prompt(make_llm, tiny_model_dir):
    eng = make_llm(model=tiny_model_dir).engine
    for n in (3, 4):
        with pytest.raises(InvalidRequestError) as e:
            eng.add_request([5, 6, 7], SamplingParams(max_tokens=2, num_replayed_tokens=n))
        assert e.value.param == "num_replayed_tokens" and "num_replayed_tokens" in str(e.value)
        with pytest.raises(InvalidRequestError) as e:
            eng.validate([5, 6, 7], SamplingParams(max_tokens=2, num_replayed_tokens=n), prefill_only=True)
        assert e.value.param == "num_replayed_tokens"
    assert not eng.requests
    params = SamplingParams(max_tokens=2, temperature=0.0, num_replayed_tokens=2)
    out = make_llm(model=tiny_model_dir).generate([[5, 6, 7]], params)[0]
    assert len(out.token_ids) == 2
