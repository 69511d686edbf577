"""Displacement at a full waiting queue (issue 36), on hand-built states: Scheduler.displaced_by names
the waiting request a newcomer takes the place of - the one that would start last by the queue's own
key (priority, then the tenant's standing, then its requests in line; the later among equals) -
and only when the newcomer ranks strictly before it; a request that started (preempted, retracted,
running) or that the asking duty does not hold is never named. PreallocStage, the decode node's queue
for KV memory, serves in the same order. The Sim of tests/engine/test_scheduler.py, block accounting
checked every step."""
from __future__ import annotations

import time

from raypd.decode_node.decode_request import DecodeRequest
from raypd.decode_node.prealloc_stage import PreallocStage
from raypd.engine.request import Request
from raypd.node.aux_slots import AuxSlots
from raypd.protocol.sampling_params import SamplingParams
from tests.engine.test_scheduler import Sim
from tests.engine.test_tenant_share import add
from tests.node.pd import prompt, request

EVERYONE = type("Everyone", (), {"__contains__": lambda self, rid: True})()  # a duty that holds every request


def params(priority: int = 0, tenant: str = "") -> SamplingParams:
    return SamplingParams(max_tokens=1, temperature=0, priority=priority, tenant=tenant)


def one_running(tenant: str = "") -> tuple[Sim, Request]:
    """A scheduler with one running slot, taken by `tenant`: whatever is added next waits."""
    sim = Sim(num_blocks=64, max_running_requests=1, max_num_batched_tokens=64)
    run = add(sim, "running", [1, 2, 3, 4], 50, tenant)
    sim.step()
    return sim, run


def test_a_more_urgent_newcomer_displaces_the_newest_of_the_least_urgent_and_a_tie_is_refused():
    sim, _ = one_running()
    for rid in ("w-0", "w-1", "w-2"):
        add(sim, rid, [10, 11, 12], 1, "")
    sim.step()
    displaced_by = sim.sched.displaced_by
    assert displaced_by(params(priority=-1), EVERYONE) == "w-2"   # the later among equals starts last
    assert displaced_by(params(priority=0), EVERYONE) is None      # it would start after all of them
    assert displaced_by(params(priority=3), EVERYONE) is None
    assert [r.request_id for r in sim.sched.waiting] == ["w-0", "w-1", "w-2"]  # asking changes nothing


def test_the_least_urgent_is_displaced_wherever_it_arrived():
    sim, _ = one_running()
    add(sim, "batch", [10, 11, 12], 1, "", priority=5)
    add(sim, "w-0", [13, 14, 15], 1, "")
    add(sim, "w-1", [16, 17, 18], 1, "")
    sim.step()
    assert sim.sched.displaced_by(params(priority=0), EVERYONE) == "batch"
    assert sim.sched.displaced_by(params(priority=5), EVERYONE) is None
    assert sim.sched.displaced_by(params(priority=-3), EVERYONE) == "batch"


def test_a_tenant_below_its_share_displaces_the_floods_newest_request_and_the_flood_is_refused():
    sim, _ = one_running()
    sim.sched.shares.counters.update({"flood": 50.0, "web": 10.0})
    for i in range(3):
        add(sim, f"flood-{i}", [20 + i, 30 + i, 40 + i], 1, "flood")
    add(sim, "web-0", [50, 51, 52], 1, "web")
    sim.step()
    counters = dict(sim.sched.shares.counters)
    assert sim.sched.displaced_by(params(tenant="web"), EVERYONE) == "flood-2"
    assert sim.sched.displaced_by(params(tenant="flood"), EVERYONE) is None   # ties its own newest
    # A more urgent flood request still goes before the flood's own last one: priority comes first.
    assert sim.sched.displaced_by(params(priority=-1, tenant="flood"), EVERYONE) == "flood-2"
    assert sim.sched.shares.counters == counters   # ranking a newcomer charges and lifts nobody


def test_a_tenant_above_its_share_is_refused_however_many_requests_the_others_have_waiting():
    sim, _ = one_running()
    sim.sched.shares.counters.update({"heavy": 100.0, "light": 10.0})
    add(sim, "light-0", [10, 11, 12], 1, "light")
    add(sim, "light-1", [13, 14, 15], 1, "light")
    sim.step()
    assert sim.sched.displaced_by(params(tenant="heavy"), EVERYONE) is None
    assert sim.sched.displaced_by(params(tenant="light"), EVERYONE) is None
    assert sim.sched.displaced_by(params(priority=-1, tenant="light"), EVERYONE) == "light-1"


def test_a_newcomer_from_a_tenant_with_nothing_here_ranks_where_it_will_be_lifted():
    """A new tenant's counter (0) would put it before everyone; it is ranked at the flood's level, where
    it is lifted once it waits, and wins only the tie on requests in line."""
    sim, _ = one_running(tenant="flood")
    add(sim, "flood-0", [10, 11, 12], 1, "flood")
    sim.step()
    assert sim.sched.displaced_by(params(tenant="new"), EVERYONE) is None     # one in line each: a tie
    add(sim, "flood-1", [13, 14, 15], 1, "flood")
    assert sim.sched.displaced_by(params(tenant="new"), EVERYONE) == "flood-1"  # two against one
    assert "new" not in sim.sched.shares.counters


def test_nothing_that_started_is_displaced():
    sim = Sim(num_blocks=64, max_running_requests=1, max_num_batched_tokens=64)
    low = add(sim, "low", [1, 2, 3, 4], 20, "", priority=9)
    sim.step()                                       # low runs
    add(sim, "urgent", [5, 6, 7, 8], 20, "", priority=0)
    sim.step()                                       # urgent preempts low: low waits again, started
    assert sim.sched.num_preemptions == 1 and low in sim.sched.waiting and low.started
    assert sim.sched.displaced_by(params(priority=-1), EVERYONE) is None   # nor the running one
    fresh = add(sim, "fresh", [9, 10, 11], 1, "", priority=5)
    assert not fresh.started
    assert sim.sched.displaced_by(params(priority=-1), EVERYONE) == "fresh"  # not low, though less urgent
    assert sim.sched.displaced_by(params(priority=-1), {"low", "urgent"}) is None  # not the asker's
    assert sim.sched.displaced_by(params(priority=-1), {"fresh"}) == "fresh"
    sim.run()
    sim.check_drained()


def test_requests_queued_in_front_of_the_engine_rank_with_its_queue():
    """A decode node's requests waiting for KV memory (`outside`): candidates after the engine's own
    (the later among equals), counted in their tenant's line."""
    sim, _ = one_running()
    add(sim, "local", [10, 11, 12], 1, "a")
    sim.step()
    outside = [("pd-0", params(tenant="a")), ("pd-1", params(tenant="b"))]
    # a, b and a newcomer's tenant c all stand at the lowest counter (a was lifted to it, b and c
    # would be): the requests in line decide.
    assert sim.sched.displaced_by(params(priority=-1), EVERYONE, outside) == "pd-0"  # a: two in line, the later
    assert sim.sched.displaced_by(params(tenant="c"), EVERYONE, outside) == "pd-0"   # c: one against a's two
    assert sim.sched.displaced_by(params(tenant="b"), EVERYONE, outside) is None     # b: two with it, a tie
    assert sim.sched.displaced_by(params(priority=-1), EVERYONE, outside[1:]) == "pd-1"


class Memory:
    """The two engine calls PreallocStage makes, over a scheduler: `grants` reservations succeed."""

    def __init__(self, sim: Sim):
        self.sim, self.grants = sim, 0

    def reserve(self, key: object, num_prompt_tokens: int) -> list[int] | None:
        if not self.grants:
            return None
        self.grants -= 1
        return [0]

    def waiting_key(self, outside):
        return self.sim.sched.waiting_key(outside)


def test_the_decode_queue_for_kv_memory_serves_in_the_engines_order():
    sim = Sim(num_blocks=64)
    sim.sched.shares.counters.update({"flood": 50.0, "web": 10.0})
    memory = Memory(sim)
    stage = PreallocStage(memory, AuxSlots(8), timeout_s=60.0)  # type: ignore[arg-type]  # the two calls it makes
    arrivals = [("flood-0", 0, "flood"), ("batch", 5, "web"), ("flood-1", 0, "flood"), ("web-0", 0, "web"),
                ("urgent", -1, "flood")]  # (what it is, priority, tenant) in arrival order
    for _, priority, tenant in arrivals:
        stage.add(DecodeRequest(request(prompt(4), params(priority, tenant))))
    assert stage.pop_ready() == [] and stage.num_blocked == 5   # no memory: the head blocks everyone
    served = []
    while stage:
        memory.grants = 1
        served += [dr.req.params for dr in stage.pop_ready()]
    assert [(p.priority, p.tenant) for p in served] == [(-1, "flood"), (0, "web"), (0, "flood"), (0, "flood"),
                                                        (5, "web")]


def test_the_decode_queue_ends_a_request_past_its_deadline_wherever_it_waits():
    sim = Sim(num_blocks=64)
    stage = PreallocStage(Memory(sim), AuxSlots(8), timeout_s=60.0)  # type: ignore[arg-type]
    first, second = DecodeRequest(request(prompt(4))), DecodeRequest(request(prompt(4)))
    stage.add(first)
    stage.add(second)
    second.deadline = time.monotonic() - 1.0
    assert stage.pop_ended() == [second] and len(stage) == 1
