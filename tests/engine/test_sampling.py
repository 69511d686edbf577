"""Sampling on the real model (seeded reproducibility, stops) and the sampler on crafted logits."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from raypd.engine import InvalidRequestError, SamplingParams
from raypd.engine.request import Request
from raypd.engine.sampler import Sampler

PROMPTS = ["Once upon a time", "The best way to learn a language is", "def add(a, b):"]


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(llm):
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=1234)
    alone = llm.generate([PROMPTS[0]], params)[0].token_ids
    again = llm.generate([PROMPTS[0]], params)[0].token_ids
    others = SamplingParams(max_tokens=24, temperature=1.0, seed=7)
    batched = llm.generate(PROMPTS, [others, params, others])  # different position in the batch
    batched_same = llm.generate([PROMPTS[1], PROMPTS[0]], [others, params])[1].token_ids
    assert alone == again == batched_same
    assert llm.generate([PROMPTS[0]], replace(params, seed=4321))[0].token_ids != alone
    assert batched[0].token_ids != batched[2].token_ids or PROMPTS[0] == PROMPTS[2]


def test_top_k_one_is_greedy(llm):
    greedy = llm.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0.0))
    topk1 = llm.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=1.3, top_k=1))
    assert [o.token_ids for o in greedy] == [o.token_ids for o in topk1]


def test_stop_token_ids_and_max_tokens(llm):
    free = llm.generate([PROMPTS[1]], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 20
    stop_at = free.token_ids[5]
    first = free.token_ids.index(stop_at)
    stopped = llm.generate([PROMPTS[1]], SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=(stop_at,)))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:first + 1]


def test_eos_stops_unless_ignored(llm):
    chat = {"messages": [{"role": "user", "content": "Say hi."}]}
    out = llm.generate([chat], SamplingParams(max_tokens=200, temperature=0.0))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] in llm.engine.model_config.eos_token_ids
    ignored = llm.generate([chat], SamplingParams(max_tokens=len(out.token_ids) + 3, temperature=0.0, ignore_eos=True))[0]
    assert ignored.finish_reason == "length" and len(ignored.token_ids) == len(out.token_ids) + 3


def test_context_length_ends_generation(make_llm):
    llm = make_llm(block_size=8)  # its own engine: the context length is shrunk for this test
    eng = llm.engine
    eng.model_config = replace(eng.model_config, max_position_embeddings=40)
    prompt = list(range(100, 130))
    out = llm.generate([prompt], SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 10
    with pytest.raises(InvalidRequestError) as e:
        llm.generate([list(range(100, 140))], SamplingParams(max_tokens=4))
    assert e.value.param == "prompt"


# -- the sampler alone ------------------------------------------------------------------------------
def _req(rid: str, params: SamplingParams, tokens=(1, 2, 3)) -> Request:
    return Request(rid, list(tokens), params, frozenset(), max_total_tokens=100)


def test_penalties_move_the_argmax():
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.9, -1.0]])
    s = Sampler(torch.device("cpu"))
    plain = _req("a", SamplingParams(temperature=0.0))
    assert s.sample(logits.clone(), [plain]) == [2]
    rep = _req("b", SamplingParams(temperature=0.0, repetition_penalty=1.5), tokens=(2,))
    assert s.sample(logits.clone(), [rep]) == [3]  # 3.0 / 1.5 < 2.9
    pres = _req("c", SamplingParams(temperature=0.0, presence_penalty=0.5), tokens=(0,))
    pres.token_ids.append(2)  # an output token
    assert s.sample(logits.clone(), [pres]) == [3]
    freq = _req("d", SamplingParams(temperature=0.0, frequency_penalty=0.06), tokens=(0,))
    freq.token_ids += [2, 2]
    assert s.sample(logits.clone(), [freq]) == [3]  # 3.0 - 0.12 < 2.9


def test_filters_keep_only_allowed_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    s = Sampler(torch.device("cpu"))
    cases = {
        (("top_k", 2),): {0, 1},
        (("top_p", 0.7),): {0, 1},  # 0.5 < 0.7, 0.8 >= 0.7: keep two
        (("top_p", 0.5),): {0},
        (("min_p", 0.5),): {0, 1},  # p >= 0.25
    }
    for opts, allowed in cases.items():
        seen = set()
        for i in range(200):
            req = _req(f"{opts}-{i}", SamplingParams(temperature=1.0, seed=i, **dict(opts)))
            seen |= set(s.sample(logits.clone(), [req]))
        assert seen == allowed, (opts, seen)


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    s = Sampler(torch.device("cpu"))
    counts = [0, 0, 0]
    for i in range(2000):
        counts[s.sample(logits.clone(), [_req(str(i), SamplingParams(temperature=1.0, seed=i))])[0]] += 1
    assert 1200 < counts[0] < 1600 and 250 < counts[1] < 550 and 100 < counts[2] < 300
