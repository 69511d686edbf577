"""The chaos run's request list: the same for the same seed, all four kinds, and openai arguments
that set only what a request needs (raypd's strict schema rejects nulls it did not expect)."""
from __future__ import annotations

import pytest

from raypd.benchmarks.chaos.workload import SAMPLING_TEMPERATURE, build_requests


def test_same_seed_same_list_other_seed_other_list():
    a = build_requests(16, seed=3)
    assert a == build_requests(16, seed=3)
    assert [r.text for r in a] != [r.text for r in build_requests(16, seed=4)]
    assert [r.index for r in a] == list(range(16))


def test_every_four_requests_cover_chat_completion_greedy_seeded():
    reqs = build_requests(8, seed=0)
    kinds = [(r.endpoint, r.sampling) for r in reqs]
    assert kinds[:4] == [("chat", "greedy"), ("completion", "greedy"), ("chat", "seeded"), ("completion", "seeded")]
    assert kinds[4:] == kinds[:4]


def test_greedy_has_no_seed_and_seeded_has_one():
    for r in build_requests(12, seed=1, max_tokens=(24, 48)):
        assert 24 <= r.max_tokens <= 48
        if r.sampling == "greedy":
            assert r.temperature == 0 and r.seed is None and r.top_p == 1.0
        else:
            assert r.temperature == SAMPLING_TEMPERATURE and isinstance(r.seed, int)


def test_create_kwargs_stream_with_usage_and_only_the_fields_set():
    greedy_chat, greedy_completion, seeded_chat, _ = build_requests(4, seed=0)
    kw = greedy_chat.create_kwargs("m")
    assert kw["stream"] is True and kw["stream_options"] == {"include_usage": True}
    assert kw["messages"] == [{"role": "user", "content": greedy_chat.text}] and "prompt" not in kw
    assert "seed" not in kw and "top_p" not in kw and kw["temperature"] == 0.0
    assert greedy_completion.create_kwargs("m")["prompt"] == greedy_completion.text
    kw = seeded_chat.create_kwargs("m")
    assert kw["seed"] == seeded_chat.seed and kw["top_p"] == seeded_chat.top_p


def test_no_requests_is_an_error():
    with pytest.raises(ValueError):
        build_requests(0)
