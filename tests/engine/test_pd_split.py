"""The engine's PD hooks in one process: a prefill-only engine computes the prompt and the first
token, its blocks are copied into blocks reserved on a second engine, which decodes the rest. The
output must equal the reference, and both engines' accounting must add up at every stage. What the
split does to the tokens is the same whatever the weights, so every test runs on the tiny random model
(tests/tiny_model.py) against transformers on that model; the default model's own greedy parity is
tests/engine/test_parity.py's."""
from __future__ import annotations

from dataclasses import replace

import pytest

from raypd.engine import InvalidRequestError, SamplingParams
from tests.conftest import NEW_TOKENS

GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)


def run_split(prefill, decode, prompt_ids, params=GREEDY):
    """Drive every prompt through prefill -> block copy -> decode; return token lists in order.
    A prefilled request waits (holding its blocks) until the decode engine can reserve room."""
    pe, de = prefill.engine, decode.engine
    for i, ids in enumerate(prompt_ids):
        pe.add_request(ids, params, request_id=f"p{i}", prefill_only=True)
    pending: list = []  # prefilled outputs waiting for a reservation
    tokens: dict[str, list[int]] = {}
    finished: set[str] = set()
    while pe.has_unfinished() or pending or de.has_unfinished():
        if pe.has_unfinished():
            for out in pe.step():
                assert out.finished and out.finish_reason == "prefilled"
                pending.append(out)
        for out in list(pending):
            i = int(out.request_id[1:])
            dst = de.reserve(("room", i), len(prompt_ids[i]))
            if dst is None:
                continue
            src = pe.prefilled_blocks(out.request_id)
            assert len(dst) == len(src)
            de.kv_cache.pool[dst] = pe.kv_cache.pool[src]
            pe.release(out.request_id)
            pending.remove(out)
            first = de.add_prefilled(("room", i), prompt_ids[i], out.new_token_ids[0], params, f"d{i}",
                                     out.num_cached_tokens)
            tokens[f"d{i}"] = list(first.new_token_ids)
            if first.finished:
                finished.add(f"d{i}")
        for out in de.step():
            tokens[out.request_id].extend(out.new_token_ids)
            if out.finished:
                finished.add(out.request_id)
    assert not pe.requests and len(finished) == len(prompt_ids)
    return [tokens[f"d{i}"] for i in range(len(prompt_ids))]


def test_prefill_then_decode_equals_reference(make_llm, prompt_ids, tiny_model_dir, tiny_reference):
    got = run_split(make_llm(model=tiny_model_dir, max_running_requests=5),
                    make_llm(model=tiny_model_dir, max_running_requests=6), prompt_ids)
    assert got == tiny_reference


def test_seeded_sampling_continues_the_single_engine_stream(make_llm, prompt_ids, tiny_model_dir):
    # The prefill engine draws position len(prompt), the decode engine the later ones: the noise is
    # a function of (seed, position), so PD gives what one engine gives, also for a failover replay
    # (prompt + the first k tokens, num_replayed_tokens=k) whose prefill draws position len(prompt) + k.
    # What is checked is the engines' bookkeeping of positions and seeds, whatever the weights.
    params = [SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=100 + i, presence_penalty=0.5,
                             ignore_eos=True) for i in range(len(prompt_ids))]
    single = make_llm(model=tiny_model_dir)
    want = [o.token_ids for o in single.generate(prompt_ids, params)]
    prefill = make_llm(model=tiny_model_dir, max_running_requests=5)
    decode = make_llm(model=tiny_model_dir, max_running_requests=6)
    got = [run_split(prefill, decode, [ids], p)[0] for ids, p in zip(prompt_ids, params)]
    assert got == want
    assert len({tuple(t) for t in got}) > 1
    k = 4
    replayed = [run_split(prefill, decode, [ids + w[:k]], replace(p, max_tokens=12 - k, num_replayed_tokens=k))[0]
                for ids, w, p in zip(prompt_ids, want, params)]
    assert [w[:k] + r for w, r in zip(want, replayed)] == want


def test_decode_retracts_and_recomputes(make_llm, prompt_ids, tiny_model_dir, tiny_reference):
    # Enough blocks for the longest request alone, far too few for all of them at once.
    longest = max(len(ids) for ids in prompt_ids) + NEW_TOKENS
    decode = make_llm(model=tiny_model_dir, num_blocks=-(-longest // 16) + 6, max_running_requests=7,
                      init_new_token_ratio=0.05, min_new_token_ratio=0.05)
    before = decode.engine.scheduler.num_retractions
    got = run_split(make_llm(model=tiny_model_dir, chunked_prefill_size=32, max_num_batched_tokens=64), decode,
                    prompt_ids)
    assert got == tiny_reference
    assert decode.engine.scheduler.num_retractions > before


def test_reservation_backpressure_and_release(make_llm, tiny_model_dir):
    eng = make_llm(model=tiny_model_dir, num_blocks=16, max_running_requests=3).engine
    first = eng.reserve("a", 200)  # 13 blocks
    assert first is not None and len(first) == 13
    assert eng.reserve("b", 100) is None  # 7 more do not fit: caller waits
    assert eng.block_accounting().held == 13
    eng.check_block_integrity()
    with pytest.raises(InvalidRequestError):
        eng.reserve("a", 16)
    with pytest.raises(InvalidRequestError):
        eng.reserve("huge", 10_000)
    eng.unreserve("a")
    assert eng.reserve("b", 100) is not None
    eng.unreserve("b")
    eng.unreserve("never-made")  # no-op


def test_bad_prefilled_request_keeps_reservation_for_caller(make_llm, tiny_model_dir):
    eng = make_llm(model=tiny_model_dir, num_blocks=16, max_running_requests=3).engine
    eng.reserve("r", 20)
    with pytest.raises(InvalidRequestError):
        eng.add_prefilled("r", list(range(20)), -5, GREEDY, "x")
    with pytest.raises(InvalidRequestError):
        eng.add_prefilled("r", list(range(40)), 1, GREEDY, "x")  # 3 blocks do not fit in 2
    with pytest.raises(InvalidRequestError):
        eng.add_prefilled("missing", list(range(20)), 1, GREEDY, "x")
    with pytest.raises(InvalidRequestError) as e:
        eng.add_prefilled("r", list(range(20)), 1, replace(GREEDY, num_replayed_tokens=20), "x")
    assert e.value.param == "num_replayed_tokens"
    assert "r" in eng.reservations
    eng.unreserve("r")


def test_prefilled_request_abort_and_first_token_stop(make_llm, prompt_ids, tiny_model_dir):
    eng = make_llm(model=tiny_model_dir, num_blocks=64, max_running_requests=2).engine
    rid = eng.add_request(prompt_ids[0], GREEDY, prefill_only=True)
    while eng.has_unfinished():
        eng.step()
    assert eng.block_accounting().held > 0 or eng.block_accounting().cached > 0
    with pytest.raises(InvalidRequestError):
        eng.release("nope")
    eng.abort(rid)  # aborting a held request frees it like release
    assert rid not in eng.requests
    # A decode-side request whose first token already ends it finishes at once.
    eng.reserve("k", len(prompt_ids[1]))
    out = eng.add_prefilled("k", prompt_ids[1], 7, SamplingParams(max_tokens=1), "one")
    assert out.finished and out.finish_reason == "length"
