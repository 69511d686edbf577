"""The local path on real actors (1 prefill + 1 decode node, the Conductor with split-or-local on,
real NIXL): a decode node prefilling prompts itself, under its per-step prompt budget, equals the
reference; when the prefill node dies, the Conductor routes every request to the decode node alone
(decode-only fallback) instead of refusing it, and nothing is left held.

On the tiny random-weight model (tests/tiny_model.py), against transformers' greedy output on it: what
is checked is what the local path and the fallback do to the tokens, whatever the weights."""
from __future__ import annotations

import asyncio

import pytest
import ray

from raypd.cluster.client.conductor_router import ConductorRouter
from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.client.router import Route
from raypd.cluster.launch.local_cluster import ClusterSpec, NodeCluster
from raypd.protocol.roles import Role
from raypd.protocol.sampling_params import SamplingParams
from tests.cluster.helpers import FAST_TRANSFER, assert_idle, kill_and_wait_dead, run_all
from tests.conftest import NEW_TOKENS

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
HEARTBEAT_S = 3.0
BUDGET = 16


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    c = NodeCluster.start(ClusterSpec(model=tiny_model_dir, prefill_nodes=1, decode_nodes=1, cpus_per_node=0.5,
                                      policy="cost", engine_options={"num_blocks": 256}, transfer_options=FAST_TRANSFER,
                                      local_prefill_budget=BUDGET,
                                      conductor_options={"heartbeat_timeout_s": HEARTBEAT_S,
                                                         "tick_interval_s": 0.2}))
    try:
        yield c
    finally:
        c.stop()


def local_prefills(cluster) -> int:
    return ray.get(cluster.by_role("decode")[0].actor.stats.remote(), timeout=30)["local_prefills"]


def test_the_decode_node_prefilling_every_prompt_itself_equals_the_reference(cluster, prompt_ids, tiny_reference):
    decode = cluster.by_role("decode")[0]
    before = local_prefills(cluster)
    with RequestDriver() as driver:
        results = run_all(driver, prompt_ids, GREEDY, prefill=decode)
    assert [t for t, _ in results] == tiny_reference
    assert all(f.error is None and "local_prefill_s" in f.timings for _, f in results)
    assert local_prefills(cluster) - before == len(prompt_ids)
    assert_idle(cluster.nodes)


def test_with_the_prefill_node_gone_the_conductor_routes_to_the_decode_node_alone(cluster, prompt_ids,
                                                                                   tiny_reference):
    kill_and_wait_dead(cluster, cluster.by_role("prefill")[0], HEARTBEAT_S + 15)
    router = ConductorRouter(cluster.conductor, cluster.nodes)
    routes: list[Route] = asyncio.run(_routes(router, prompt_ids))
    assert all(r.decode is None and r.prefill.role == Role.DECODE for r in routes)
    assert router.num_fallbacks == 0                      # the Conductor's own answer, not the fallback's
    with RequestDriver() as driver:
        results = run_all(driver, prompt_ids, GREEDY, router=router)
    assert [t for t, _ in results] == tiny_reference
    status = ray.get(cluster.conductor.status.remote())
    assert status["local_decisions"] >= 2 * len(prompt_ids)
    d = ray.get(cluster.conductor.recent_decisions.remote(1))[0]
    assert d.path == "local" and d.branch == "no-prefill-node" and "local on" in d.explain()
    assert_idle(cluster.nodes)


async def _routes(router: ConductorRouter, prompts) -> list[Route]:
    return [await router.route(f"probe-{i}", ids) for i, ids in enumerate(prompts)]
