"""Abort at any point frees everything the request held (the autouse fixture checks the counts)."""
from __future__ import annotations

from raypd.engine import SamplingParams

LONG = list(range(1000, 1300))


def _run_until(eng, predicate, limit=200):
    for _ in range(limit):
        if predicate():
            return
        eng.step()
    raise AssertionError("condition never reached")


def test_abort_waiting_running_and_mid_prefill(make_llm):
    llm = make_llm(chunked_prefill_size=32, max_num_batched_tokens=64, max_running_requests=2)
    eng = llm.engine
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    a = eng.add_request(LONG, params)
    b = eng.add_request(LONG[:100] + [5, 6, 7], params)
    c = eng.add_request([7, 8, 9, 10], params)  # waits: max_running_requests=2
    eng.step()
    req_a = eng.requests[a]
    assert 0 < req_a.num_computed_tokens < len(LONG)  # mid-prefill
    eng.abort(a)
    eng.abort(c)  # still waiting
    _run_until(eng, lambda: eng.requests[b].num_output_tokens > 3)
    eng.abort(b)  # decoding
    eng.abort(b)  # twice is harmless
    assert not eng.has_unfinished() and not eng.requests
    eng.check_block_integrity()


def test_abort_after_retraction(make_llm):
    llm = make_llm(num_blocks=24, chunked_prefill_size=64)
    eng = llm.engine
    params = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)
    rids = [eng.add_request(list(range(200 + 40 * i, 240 + 40 * i + 100)), params) for i in range(3)]
    _run_until(eng, lambda: eng.scheduler.num_retractions > 0, limit=400)
    for r in rids:
        eng.abort(r)
    assert not eng.has_unfinished()
