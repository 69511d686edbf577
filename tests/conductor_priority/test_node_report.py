"""What a node reports of its queue by priority, from a real engine's scheduler state (the tiny
model): waiting prompts at their own priority, prompts already running in chunks ahead of every new
request under fcfs (whose steps serve them before admitting anyone) and at their own priority under
srpt; the sum always the queued_prefill_tokens it reported before priorities. Then the node's
LoadReport: the engine's part plus what its duty holds outside the engine."""
from __future__ import annotations

import pytest

from raypd.engine.engine import LLMEngine
from raypd.engine.request import Request
from raypd.node.node_core import NodeCore
from raypd.node.node_duty import DutyLoad
from raypd.protocol.queued_by_priority import MOST_URGENT, summarize
from raypd.protocol.roles import Role
from raypd.protocol.sampling_params import SamplingParams

# Steps of 16 prompt tokens: a 20-token prompt takes two, so one is caught running mid-prompt.
OPTIONS = dict(num_blocks=64, chunked_prefill_size=16, max_num_batched_tokens=16, max_running_requests=4)
REQUESTS = (("batch-a", 40, 5), ("batch-b", 24, 5), ("urgent", 20, -1), ("default", 12, 0))


def add_all(engine: LLMEngine) -> None:
    for i, (rid, n, priority) in enumerate(REQUESTS):
        prompt = [100 + 50 * i + k for k in range(n)]
        engine.add_request(prompt, SamplingParams(max_tokens=2, temperature=0, priority=priority), rid)


def uncomputed(r: Request) -> int:
    return r.num_prompt_tokens - min(r.num_computed_tokens, r.num_prompt_tokens)


def by_hand(engine: LLMEngine, running_at_own: bool) -> tuple[tuple[int, int], ...]:
    """The summary from the scheduler's queues, walked here; and the pre-priority total must match."""
    sched = engine.scheduler
    pairs = [(r.params.priority, uncomputed(r)) for r in sched.waiting]
    pairs += [(r.params.priority if running_at_own else MOST_URGENT, uncomputed(r)) for r in sched.running]
    return summarize(pairs)


@pytest.mark.parametrize("policy", ["fcfs", "srpt"])
def test_the_engine_reports_its_queue_by_the_priority_a_new_request_sees_it_at(tiny_model_dir, policy):
    engine = LLMEngine(tiny_model_dir, schedule_policy=policy, **OPTIONS)
    add_all(engine)
    load = engine.load()
    assert load.queued_by_priority == ((-1, 20), (0, 12), (5, 64)) and load.queued_prefill_tokens == 96
    engine.step()   # the urgent prompt first: 16 of its 20 tokens, the rest next step
    load = engine.load()
    urgent_rest = (MOST_URGENT, 4) if policy == "fcfs" else (-1, 4)
    assert load.queued_by_priority == (urgent_rest, (0, 12), (5, 64)) and load.queued_prefill_tokens == 80
    steps = 1
    while engine.scheduler.has_unfinished():
        load = engine.load()
        assert load.queued_by_priority == by_hand(engine, running_at_own=policy == "srpt")
        total = sum(uncomputed(r) for r in (*engine.scheduler.waiting, *engine.scheduler.running))
        assert load.queued_prefill_tokens == sum(t for _, t in load.queued_by_priority) == total
        engine.step()
        steps += 1
    assert engine.load().queued_by_priority == () and engine.load().queued_prefill_tokens == 0 and steps > 6


def test_the_node_report_adds_what_its_duty_holds_outside_the_engine(tiny_model_dir):
    core = NodeCore("p0", Role.PREFILL, tiny_model_dir, OPTIONS)
    try:
        add_all(core.engine)
        core.engine.step()   # 16 urgent tokens computed, 4 running ahead of everyone
        # A prefill duty's bootstrap stage: requests not yet in the engine, at their own priorities.
        held = DutyLoad(waiting=3, queued_tokens=70, queued_by_priority=((-1, 30), (5, 40)))
        report = core.load_report(held)
        assert report.queued_prefill_tokens == 80 + 70
        assert report.queued_prefill_by_priority == ((MOST_URGENT, 4), (-1, 30), (0, 12), (5, 104))
        assert [report.queued_prefill_ahead_of(p) for p in (-9, -1, 0, 5)] == [4, 34, 46, 150]
        # A duty that reports no priorities: its tokens count ahead of every request.
        report = core.load_report(DutyLoad(waiting=1, queued_tokens=10))
        assert report.queued_prefill_by_priority == ((MOST_URGENT, 14), (0, 12), (5, 64))
        assert report.queued_prefill_ahead_of(-9) == 14
        # A flex node's two duties together.
        both = DutyLoad(1, 30, queued_by_priority=((-1, 30),)) + DutyLoad(2, 40, queued_by_priority=((5, 40),))
        assert (both.queued_tokens, both.queued_by_priority) == (70, ((-1, 30), (5, 40)))
    finally:
        core.shutdown()
