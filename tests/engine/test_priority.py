"""Priority (SamplingParams.priority, lower is more urgent) at the node's scheduler: the waiting queue
in priority order (arrival order within one), and a running request less urgent than the head of
the queue preempted when the head wants its slot or its memory: back to waiting first of its
priority, its computed blocks left in the prefix cache. Hand-driven schedulers with exact block ids
(the Sim of test_scheduler.py, block accounting checked every step), then a real engine whose
greedy tokens must not depend on who was preempted."""
from __future__ import annotations

import pytest

from raypd.engine import LLMEngine
from raypd.engine.request import Request, RequestStatus
from raypd.protocol.errors import InvalidRequestError
from raypd.protocol.sampling_params import SamplingParams
from tests.engine.test_scheduler import Sim, ids, plan


def add(sim: Sim, rid: str, tokens: list[int], max_tokens: int, priority: int) -> Request:
    req = Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens, temperature=0, priority=priority),
                  stop_token_ids=frozenset(), max_total_tokens=len(tokens) + max_tokens)
    sim.requests.append(req)
    sim.sched.add(req)
    return req


def test_the_waiting_queue_starts_the_most_urgent_first_then_by_arrival():
    sim = Sim(num_blocks=64, max_running_requests=1, max_num_batched_tokens=64)
    for i, (rid, priority) in enumerate((("a", 5), ("b", 0), ("c", -1), ("d", 0))):
        add(sim, rid, [10 * i + 1, 10 * i + 2, 10 * i + 3], 1, priority)
    started = []
    while sim.sched.has_unfinished():
        started += [x.request.request_id for x in sim.step().items if x.start == 0]
    assert started == ["c", "b", "d", "a"]
    assert sim.sched.num_preemptions == 0  # one at a time by the cap alone: nobody was less urgent
    sim.check_drained()


def test_a_more_urgent_request_preempts_the_newest_least_urgent_at_the_running_cap():
    sim = Sim(num_blocks=64, max_running_requests=2, max_num_batched_tokens=64)
    add(sim, "low-old", [1, 2, 3, 4], 8, priority=5)
    low_new = add(sim, "low-new", [5, 6, 7, 8], 8, priority=5)
    sim.step()
    sim.step()
    assert ids(sim.sched.running) == ["low-old", "low-new"]
    blocks = list(low_new.block_table)  # its computed prompt blocks: [2, 3] of 2 tokens each
    add(sim, "later-low", [9, 9, 9, 9], 2, priority=5)
    add(sim, "urgent", [11, 12, 13], 2, priority=0)
    batch = sim.step()
    assert ("urgent", 0, 3) in plan(batch) and "low-new" not in ids(x.request for x in batch.items)
    assert sim.sched.num_preemptions == 1 and sim.sched.num_retractions == 0
    # Back to waiting, first of its priority (before the later arrival), its prompt blocks cached.
    assert ids(sim.sched.waiting) == ["low-new", "later-low"] and low_new.status == RequestStatus.WAITING
    assert sim.cache.match_prefix(low_new.token_ids, 2).blocks == blocks[:2]
    while "low-new" not in ids(sim.sched.running):
        sim.step()
    assert low_new.block_table[:2] == blocks[:2] and low_new.num_cached_tokens == 0  # cached at first admission only
    sim.run()
    assert [len(r.output_token_ids) for r in sim.requests] == [8, 8, 2, 2]
    sim.check_drained()


def test_a_more_urgent_request_preempts_for_memory_and_never_an_equal_or_more_urgent_one():
    # 8 blocks of 2 tokens: two 6-token prompts hold 6; an 8-token prompt needs 4 more than is left.
    sim = Sim(num_blocks=8, max_running_requests=4, max_num_batched_tokens=64)
    add(sim, "urgent-running", [1] * 6, 1 + 4, priority=0)
    add(sim, "low", [2] * 6, 1 + 4, priority=3)
    sim.step()
    add(sim, "same", [3] * 8, 1, priority=3)  # as urgent as "low": it waits
    sim.step()
    assert "same" not in ids(sim.sched.running) and sim.sched.num_preemptions == 0
    add(sim, "urgent", [4] * 8, 1, priority=1)  # more urgent than "low", less than "urgent-running"
    batch = sim.step()  # "low" goes back, its decode token of this step undone; "urgent" takes its memory
    assert plan(batch) == [("urgent-running", 7, 1), ("urgent", 0, 8)]
    assert ids(sim.sched.waiting) == ["low", "same"] and sim.sched.num_preemptions == 1
    sim.run()
    sim.check_drained()


@pytest.mark.parametrize("policy", ["lpm", "srpt"])
def test_the_other_policies_order_within_a_priority_and_preempt_the_same_way(policy):
    sim = Sim(num_blocks=64, max_running_requests=1, max_num_batched_tokens=64, schedule_policy=policy)
    low = add(sim, "low", [1, 2, 3, 4], 6, priority=2)
    sim.step()
    add(sim, "long-urgent", list(range(20, 30)), 2, priority=0)
    add(sim, "short-urgent", [40, 41], 2, priority=0)
    batch = sim.step()
    # Both urgent requests come before "low"; srpt starts the shorter one of them first.
    first = "short-urgent" if policy == "srpt" else "long-urgent"
    assert ids(x.request for x in batch.items) == [first] and sim.sched.num_preemptions == 1
    assert low.status == RequestStatus.WAITING and ids(sim.sched.waiting)[-1] == "low"
    sim.run()
    assert [len(r.output_token_ids) for r in sim.requests] == [6, 2, 2]
    sim.check_drained()


def test_priority_is_an_integer():
    for bad in (1.5, True, "1", 2**31):
        with pytest.raises(InvalidRequestError, match="priority"):
            SamplingParams(priority=bad)


def test_a_real_engine_gives_each_request_its_greedy_tokens_whoever_is_preempted(tiny_model_dir):
    prompts = [list(range(10, 40)), list(range(100, 120)), list(range(200, 230)), list(range(300, 312))]

    def run(priorities: list[int], max_running: int) -> tuple[list[list[int]], int]:
        eng = LLMEngine(tiny_model_dir, kv_cache_memory_mb=16, max_running_requests=max_running)
        rids = [eng.add_request(p, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, priority=q))
                for p, q in zip(prompts[:3], priorities)]
        tokens: dict[str, list[int]] = {r: [] for r in rids}
        for _ in range(2):  # the first ones are decoding when the urgent one comes
            for o in eng.step():
                tokens[o.request_id] += o.new_token_ids
        rids.append(eng.add_request(prompts[3], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                                                               priority=-1)))
        tokens[rids[-1]] = []
        while eng.has_unfinished():
            for o in eng.step():
                tokens[o.request_id] += o.new_token_ids
        eng.check_block_integrity()
        return [tokens[r] for r in rids], eng.stats()["num_preemptions"]

    alone, none = run([0, 0, 0], max_running=4)
    preempted, count = run([2, 1, 2], max_running=3)
    assert none == 0 and count >= 1
    assert preempted == alone
