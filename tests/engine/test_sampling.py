"""Sampling on the real model (seeded reproducibility, stops) and the sampler on crafted logits."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from raypd.engine import InvalidRequestError, SamplingParams
from raypd.engine.request import Request
from raypd.engine.sampler import Sampler, noise_seed

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


def test_context_length_ends_generation(make_llm, tiny_model_dir):
    # Its own engine (the context length is shrunk for this test), on the tiny model: a matter of lengths.
    llm = make_llm(model=tiny_model_dir, block_size=8)
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


# -- noise as a function of (seed, position) --------------------------------------------------------
def test_noise_seed_is_splitmix64_of_the_mixed_seed():
    # SplitMix64 seeded with 0 (mix64(0) == 0): its published first outputs.
    assert [noise_seed(0, p) for p in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert noise_seed(-1, 5) == noise_seed(2**64 - 1, 5)  # the seed counts modulo 2**64
    assert len({noise_seed(s, p) for s in range(50) for p in range(50)}) == 2500
    assert len({noise_seed(s, p) % 2**32 for s in range(50) for p in range(50)}) == 2500  # the CPU generator's bits


def test_noise_depends_only_on_seed_and_position():
    vocab = 4096
    flat = torch.zeros(1, vocab)
    seeded = SamplingParams(temperature=1.0, seed=99)
    # Engine A: the request alone, one draw at each position.
    a = Sampler(torch.device("cpu"), seed=1)
    ref, winners = [], []
    req = _req("x", seeded, tokens=range(10))
    for _ in range(6):
        ref.append(a.noise(req, vocab))
        winners.append(a.sample(flat.clone(), [req])[0])
        req.token_ids.append(winners[-1])
    assert winners == [int(n.argmin()) for n in ref]
    assert len({int(n.argmin()) for n in ref}) > 1  # the noise moves with the position
    # Engine B: other seed source, unrelated draws first, the same request in a mixed batch under
    # another id, rows before and after it, and it joins at position 12 (a replay of 2 tokens).
    b = Sampler(torch.device("cpu"), seed=2)
    others = [_req(f"o{i}", SamplingParams(temperature=0.7, seed=i if i % 2 else None), tokens=range(3 + i))
              for i in range(4)]
    for _ in range(3):
        b.sample(torch.randn(4, vocab), others)
    twin = _req("y", seeded, tokens=list(range(10)) + winners[:2])
    got = []
    for _ in range(4):
        batch = [others[0], twin, others[1], _req("greedy", SamplingParams(temperature=0.0)), others[2]]
        logits = torch.randn(len(batch), vocab)
        logits[1] = 0.0
        got.append(b.sample(logits, batch)[1])
        twin.token_ids.append(got[-1])
        for o in others:
            o.token_ids.append(0)
    assert got == winners[2:]
    assert torch.equal(b.noise(_req("z", seeded, tokens=range(13)), vocab), ref[3])
    assert not torch.equal(b.noise(_req("z", replace(seeded, seed=100), tokens=range(13)), vocab), ref[3])


def test_unseeded_request_keeps_its_drawn_seed_until_released():
    s = Sampler(torch.device("cpu"))
    req = _req("u", SamplingParams(temperature=1.0))
    first = s.noise(req, 1000)
    assert torch.equal(s.noise(req, 1000), first)  # same request, same position
    other = s.noise(_req("v", SamplingParams(temperature=1.0)), 1000)
    assert not torch.equal(other, first)
    s.release("u")
    assert not torch.equal(s.noise(req, 1000), first)  # a new seed after release


def test_presence_and_frequency_count_the_replayed_prompt_tail():
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.9, -1.0]])
    s = Sampler(torch.device("cpu"))
    pres = SamplingParams(temperature=0.0, presence_penalty=0.5)
    assert s.sample(logits.clone(), [_req("p0", pres, tokens=(0, 2))]) == [2]  # 2 is prompt: no penalty
    replayed = _req("p1", replace(pres, num_replayed_tokens=1), tokens=(0, 2))
    assert replayed.generated_token_ids == [2]
    assert s.sample(logits.clone(), [replayed]) == [3]
    freq = replace(pres, presence_penalty=0.0, frequency_penalty=0.06, num_replayed_tokens=2)
    twice = _req("f", freq, tokens=(2, 2, 0))  # one 2 in the replayed tail, one in the output
    twice.token_ids.append(2)
    assert twice.generated_token_ids == [2, 0, 2]
    assert s.sample(logits.clone(), [twice]) == [3]  # 3.0 - 0.12 < 2.9
    once = _req("g", replace(freq, num_replayed_tokens=1), tokens=(2, 2, 0))  # both prompt 2s are prompt
    once.token_ids.append(2)
    assert s.sample(logits.clone(), [once]) == [2]  # 3.0 - 0.06 > 2.9
