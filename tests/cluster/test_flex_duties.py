"""Flex nodes changing duty on real actors (2 flex nodes started 1 prefill + 1 decode, the Conductor
with split-or-local and its duty planner, real NIXL). The planner releases the idle prefill node to
decode while the decode node works; an operator's orders under load drain the old duty first. No
request is lost, every output equals the reference, every block is accounted for after.

On the tiny random-weight model (tests/tiny_model.py), against transformers' greedy output on it: what
is checked is what the duty changes do to the requests and their tokens, whatever the weights."""
from __future__ import annotations

import asyncio
import time

import pytest
import ray

from raypd.cluster.client.conductor_router import ConductorRouter
from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.launch.local_cluster import ClusterSpec, NodeCluster
from raypd.protocol.sampling_params import SamplingParams
from tests.cluster.helpers import FAST_TRANSFER, assert_idle, collect, wait_for
from tests.conftest import NEW_TOKENS

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
WAIT_S = 120.0
# decode_busy_step_s=0: any decode step counts as pressure, so the idle prefill node is released
PLANNER = {"busy_wait_s": 30.0, "hold_s": 1.0, "cooldown_s": 2.0, "min_prefill_nodes": 0,
           "decode_busy_step_s": 0.0}
# On the tiny model a wave of the prompts decodes in well under hold_s: waves overlap, a new one every
# WAVE_EVERY_S while fewer than MAX_WAVES are unfinished, so the decode node works without a pause.
WAVE_EVERY_S = 0.25
MAX_WAVES = 2


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    from raypd.conductor.config import DutyPlannerConfig, LocalPrefillConfig

    c = NodeCluster.start(ClusterSpec(
        model=tiny_model_dir, prefill_nodes=1, decode_nodes=1, flex=True, cpus_per_node=0.5, policy="cost",
        engine_options={"num_blocks": 512}, transfer_options=FAST_TRANSFER, local_prefill_budget=16,
        conductor_options={"tick_interval_s": 0.2, "duties": DutyPlannerConfig(**PLANNER),
                           "local_prefill": LocalPrefillConfig(enabled=True, step_budget_tokens=16)}))
    try:
        yield c
    finally:
        c.stop()


def duties(cluster) -> dict[str, str]:
    nodes = ray.get(cluster.conductor.status.remote(), timeout=30)["nodes"]
    return {name: n["duty"] for name, n in nodes.items() if n["alive"]}


async def _serve(driver: RequestDriver, router: ConductorRouter, prompts, tag: str):
    async def one(i: int, ids):
        request_id = f"{tag}{i}-{time.monotonic_ns()}"
        route = await router.route(request_id, ids)
        return await collect(driver, request_id, ids, GREEDY, prefill=route.prefill, decode=route.decode)
    return await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts)))


def test_the_planner_releases_the_idle_prefill_node_to_decode(cluster, prompt_ids, tiny_reference):
    """Prompts are short next to 48 decode steps each: the prefill node idles while the decode node
    decodes (waves of them, until the planner acts), so the planner moves it to decode and both nodes
    then serve (prefilling locally)."""
    assert sorted(duties(cluster).values()) == ["decode", "prefill"]
    router = ConductorRouter(cluster.conductor, cluster.nodes)
    with RequestDriver() as driver:
        async def main():
            first: list[asyncio.Future] = []
            deadline = time.monotonic() + WAIT_S
            while "prefill" in duties(cluster).values():
                assert time.monotonic() < deadline, "the planner never released the idle prefill node"
                if sum(not wave.done() for wave in first) < MAX_WAVES:
                    first.append(asyncio.ensure_future(_serve(driver, router, prompt_ids, f"a{len(first)}-")))
                await asyncio.sleep(WAVE_EVERY_S)
            second = await _serve(driver, router, prompt_ids, "b")   # routed once both nodes decode
            return [await wave for wave in first], second
        first, second = asyncio.run(main())
    assert first, "the planner moved the prefill node before any request"
    for wave in first + [second]:
        assert [t for t, _ in wave] == tiny_reference
        assert all(f.error is None for _, f in wave)
    status = ray.get(cluster.conductor.status.remote(), timeout=30)
    orders = status["duty_orders"]
    assert orders and orders[0]["duty"] == "decode" and "prompt wait" in orders[0]["reason"]
    # The Conductor hears the drain ended with the node's next load report (every 0.5 s), which the
    # tiny model's second wave may outrun.
    wait_for(lambda: sorted(duties(cluster).values()) == ["decode", "decode"], "both nodes to decode", WAIT_S,
             period_s=0.1)
    assert status["local_decisions"] >= 1
    assert_idle(cluster.nodes)


def test_operator_orders_under_load_drain_first_and_lose_nothing(cluster, prompt_ids, tiny_reference):
    """With the planner paused, one node is ordered to prefill while it decodes a wave of requests:
    it reports the drain (routed nothing) until its last sequence ends, then prefills for the other.
    A second wave routed during the drain and a third after it both equal the reference."""
    ray.get(cluster.conductor.pause_duty_planner.remote(True), timeout=30)
    names = sorted(duties(cluster))
    for name in names:                                   # whatever the planner left: both decode
        if duties(cluster)[name] != "decode":
            ray.get(cluster.conductor.set_duty.remote(name, "decode"), timeout=30)
    wait_for(lambda: sorted(duties(cluster).values()) == ["decode", "decode"], "both nodes to decode", WAIT_S, period_s=0.1)
    mover = next(n for n in cluster.nodes if n.name == names[0])
    router = ConductorRouter(cluster.conductor, cluster.nodes)
    seen: set[str] = set()
    with RequestDriver() as driver:
        async def main():
            first = asyncio.ensure_future(_serve(driver, router, prompt_ids, "c"))
            while (await mover.actor.stats.remote())["queues"]["running"] == 0:
                assert not first.done(), "the wave ended before the node held a sequence"
                await asyncio.sleep(0.05)
            state = await cluster.conductor.set_duty.remote(mover.name, "prefill")
            seen.add(state)
            assert duties(cluster)[mover.name] == "draining-to-prefill"      # routed nothing from now on
            second = asyncio.ensure_future(_serve(driver, router, prompt_ids, "d"))
            while (duty := (await mover.actor.load_report.remote()).duty) != "prefill":
                seen.add(duty)
                await asyncio.sleep(0.05)
            third = await _serve(driver, router, prompt_ids, "e")
            return await first, await second, third
        waves = asyncio.run(main())
    for wave in waves:
        assert [t for t, _ in wave] == tiny_reference
        assert all(f.error is None for _, f in wave)
    assert "draining-to-prefill" in seen
    during = [d for d in ray.get(cluster.conductor.recent_decisions.remote(200), timeout=30)
              if d.request_id.startswith("d")]        # wave d was routed while the mover drained
    assert len(during) == len(prompt_ids)
    assert all(mover.name not in (d.prefill_node, d.decode_node) for d in during), [d.explain() for d in during]
    # As above: the Conductor hears the drain ended with the node's next load report.
    wait_for(lambda: duties(cluster)[mover.name] == "prefill", "the Conductor to see the mover prefill", WAIT_S,
             period_s=0.1)
    stats = ray.get(mover.actor.stats.remote(), timeout=30)
    assert stats["duty"] == "prefill" and stats["duty_changes"] >= 1 and stats["completed"] >= 1
    assert_idle(cluster.nodes)
    ray.get(cluster.conductor.pause_duty_planner.remote(False), timeout=30)
