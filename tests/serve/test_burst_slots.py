"""Burst slots at the ingress's gate (cluster/serve/admission.py): when a flood holds every slot, a
request that would be first in line and is owed a slot (more urgent than a holder, or of a tenant
holding less than an equal share) takes one of max_burst slots over max_ongoing at once instead of
waiting for a flood's request to end; a slot given back while bursts are taken is not handed on."""
from __future__ import annotations

import asyncio

import pytest

from raypd.cluster.serve.admission import AdmissionGate


async def hold(gate: AdmissionGate, n: int, tenant: str, priority: int = 0) -> None:
    for _ in range(n):
        await gate.acquire(priority, tenant)


def test_a_tenant_holding_no_slot_takes_a_burst_slot_past_a_flood():
    async def run():
        gate = AdmissionGate(max_ongoing=8, max_queued=8)   # max_burst: 8 // 8 = 1
        await hold(gate, 8, "flood")
        gate.release("flood", 100)                          # the flood has been served
        await hold(gate, 1, "flood")
        flood_waiters = [asyncio.ensure_future(gate.acquire(0, "flood")) for _ in range(2)]
        await asyncio.sleep(0)
        # Lifted to the flood's counter, fewer in line: first in line, and holding nothing.
        await asyncio.wait_for(gate.acquire(0, "interactive"), 1)   # at once, not after a release
        assert gate.state()["ongoing"] == 9 and gate.state()["burst"] == 1
        # The burst is spent: the next owed request waits in line (first, ahead of the flood's).
        second = asyncio.ensure_future(gate.acquire(0, "other"))
        await asyncio.sleep(0)
        assert not second.done() and gate.queued == 3
        gate.release("flood", 100)            # over max_ongoing: this slot shrinks the burst, no hand-over
        await asyncio.sleep(0)
        assert (gate.ongoing, second.done(), any(w.done() for w in flood_waiters)) == (8, False, False)
        gate.release("flood", 100)            # back at max_ongoing: handed to the first in line
        await asyncio.wait_for(second, 1)
        assert not any(w.done() for w in flood_waiters)
        for tenant in ["interactive", "other"]:
            gate.release(tenant, 10)
        await asyncio.wait_for(asyncio.gather(*flood_waiters), 1)
        for _ in range(8):
            gate.release("flood", 10)
        assert (gate.ongoing, gate.queued) == (0, 0)
    asyncio.run(run())


def test_a_tenant_at_its_share_waits_like_everyone_else():
    async def run():
        gate = AdmissionGate(max_ongoing=4, max_queued=4)
        await hold(gate, 2, "a")
        await hold(gate, 2, "b")
        waiter = asyncio.ensure_future(gate.acquire(0, "a"))   # a holds 2 of 4, its equal share of 2 tenants
        await asyncio.sleep(0)
        assert not waiter.done() and gate.state()["burst"] == 0
        gate.release("b", 10)
        await asyncio.wait_for(waiter, 1)
    asyncio.run(run())


def test_a_more_urgent_request_takes_a_burst_slot_within_one_tenant():
    async def run():
        gate = AdmissionGate(max_ongoing=2, max_queued=2)
        await hold(gate, 2, "t", priority=0)
        await asyncio.wait_for(gate.acquire(-1, "t"), 1)         # more urgent than a holder
        assert gate.state()["burst"] == 1
        same = asyncio.ensure_future(gate.acquire(0, "t"))     # as urgent as the holders: waits
        await asyncio.sleep(0)
        assert not same.done()
        gate.release("t", 10, priority=-1)                     # shrinks the burst: no hand-over
        await asyncio.sleep(0)
        assert not same.done()
        gate.release("t", 10)
        await asyncio.wait_for(same, 1)
    asyncio.run(run())


def test_a_request_behind_others_in_line_does_not_jump_it():
    async def run():
        gate = AdmissionGate(max_ongoing=2, max_queued=4, max_burst=1)
        await hold(gate, 2, "flood")
        await asyncio.wait_for(gate.acquire(0, "a"), 1)           # the one burst slot
        urgent = asyncio.ensure_future(gate.acquire(-1, "flood"))  # owed, but no burst slot left: waits
        await asyncio.sleep(0)
        gate.release("flood", 10)                                  # shrinks the burst: 2 held, no hand-over
        await asyncio.sleep(0)
        assert (gate.ongoing, urgent.done()) == (2, False)
        late = asyncio.ensure_future(gate.acquire(0, "b"))         # owed, a burst slot is free, but urgent is ahead
        await asyncio.sleep(0)
        assert not late.done() and gate.queued == 2
        gate.release("a", 10)
        await asyncio.wait_for(urgent, 1)
        assert not late.done()
        gate.release("flood", 10, priority=-1)
        await asyncio.wait_for(late, 1)
    asyncio.run(run())


def test_a_negative_burst_is_refused():
    with pytest.raises(ValueError, match="max_burst"):
        AdmissionGate(max_ongoing=1, max_queued=0, max_burst=-1)
