"""Tenant fairness at the node's scheduler (SamplingParams.tenant; protocol/fair_share.py): within
a priority, the waiting requests of the tenant this node has computed the fewest tokens for start
first; a tenant that comes back is lifted to the others' level (no credit banked while away);
priority still comes first; one tenant keeps the policy's order. Hand-driven schedulers (the Sim of
test_scheduler.py, block accounting checked every step)."""
from __future__ import annotations

import pytest

from raypd.engine.request import Request
from raypd.protocol.errors import InvalidRequestError
from raypd.protocol.sampling_params import SamplingParams
from tests.engine.test_scheduler import Sim


def add(sim: Sim, rid: str, tokens: list[int], max_tokens: int, tenant: str, priority: int = 0) -> Request:
    req = Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens, temperature=0, priority=priority,
                                                    tenant=tenant),
                  stop_token_ids=frozenset(), max_total_tokens=len(tokens) + max_tokens)
    sim.requests.append(req)
    sim.sched.add(req)
    return req


def started_order(sim: Sim) -> list[str]:
    started = []
    while sim.sched.has_unfinished():
        started += [x.request.request_id for x in sim.step().items if x.start == 0]
    return started


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "srpt"])
def test_a_tenant_served_less_starts_before_a_flood_that_came_first(policy):
    sim = Sim(num_blocks=64, max_running_requests=1, max_num_batched_tokens=64, schedule_policy=policy)
    for i in range(4):
        add(sim, f"flood-{i}", [10 + i, 20 + i, 30 + i, 40 + i], 2, "flood")
    sim.step()                                       # flood-0 starts: the flood has been served
    add(sim, "web-0", [50, 51, 52, 53], 2, "web")
    add(sim, "web-1", [60, 61, 62, 63], 2, "web")
    # web was lifted to the flood's counter when it came (4 prompt tokens then); each flood request
    # adds 4 + 1 tokens, each web one the same: they alternate, web's first as soon as flood-0 ends.
    assert started_order(sim) == ["web-0", "flood-1", "web-1", "flood-2", "flood-3"]
    assert sim.sched.num_preemptions == 0            # fairness only orders the queue
    sim.check_drained()


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "srpt"])
def test_a_tenant_lifted_to_a_floods_level_goes_before_the_floods_queue(policy):
    """The tie the lift makes goes to the tenant with fewer requests waiting (as at the ingress)."""
    sim = Sim(num_blocks=64, max_running_requests=1, max_num_batched_tokens=64, schedule_policy=policy)
    for i in range(4):
        add(sim, f"flood-{i}", [10 + i, 20 + i, 30 + i, 40 + i], 1, "flood")
    sim.step()                                       # flood-0 computed and finished: the flood is at 4
    add(sim, "web-0", [50, 51, 52, 53], 1, "web")    # lifted to 4 as well
    assert started_order(sim) == ["web-0", "flood-1", "flood-2", "flood-3"]
    sim.check_drained()


def test_priority_comes_before_the_tenants_share_and_one_tenant_keeps_arrival_order():
    sim = Sim(num_blocks=64, max_running_requests=1, max_num_batched_tokens=64)
    add(sim, "a-0", [1, 2, 3], 1, "a")
    sim.step()
    add(sim, "a-1", [4, 5, 6], 1, "a")
    add(sim, "b-low", [7, 8, 9], 1, "b", priority=5)
    add(sim, "a-urgent", [10, 11, 12], 1, "a", priority=-1)
    add(sim, "a-2", [13, 14, 15], 1, "a")
    assert started_order(sim) == ["a-urgent", "a-1", "a-2", "b-low"]
    sim.check_drained()


def test_a_tenant_back_after_a_pause_banks_no_credit():
    sim = Sim(num_blocks=64, max_running_requests=1, max_num_batched_tokens=64)
    add(sim, "early-0", [1, 2, 3, 4], 1, "early")         # served while nobody else has requests
    add(sim, "busy-0", [5, 6, 7, 8], 1, "busy")
    started_order(sim)
    for i in range(3):                               # busy alone for a while: its counter grows
        add(sim, f"busy-{i + 1}", [20 + i, 30 + i, 40 + i, 50 + i], 1, "busy")
    sim.step()
    counters = sim.sched.shares.counters
    assert counters["busy"] > counters["early"]
    add(sim, "early-1", [60, 61, 62, 63], 1, "early")
    sim.step()                                       # early is back: lifted to busy's level
    assert counters["early"] >= counters["busy"] - 5  # at most the step's own tokens apart
    sim.run()
    sim.check_drained()


def test_a_tenant_is_a_short_string():
    assert SamplingParams(tenant="web").tenant == "web"
    with pytest.raises(InvalidRequestError, match="tenant"):
        SamplingParams(tenant="x" * 65)
    with pytest.raises(InvalidRequestError, match="tenant"):
        SamplingParams(tenant=3)  # type: ignore[arg-type]
