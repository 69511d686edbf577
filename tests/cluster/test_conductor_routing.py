"""The Conductor routing real nodes (2 prefill + 1 decode, real NIXL transport): requests sharing a
prefix go to the node holding it and the cached tokens the node delivers equal the prediction; a
forced migration copies a prefix and a request served from the copy matches the reference; a killed
prefill node leaves routing within the heartbeat timeout.

The one cluster module on the default model, against hf_reference (tests/tiny_model.py). The cost
policy weighs a cache hit against recomputing or fetching at the nodes' measured prefill speed, so
its choices are a deployment's only on a model whose prefill costs what a real one does (on the tiny
model a fetch to the idle node can beat the holder). Its requests also cross nodes (prefill to
decode, a prefix copied between prefill nodes) and are served from cache hits: what keeps the real
weights' tokens checked across nodes."""
from __future__ import annotations

import asyncio
import time

import pytest
import ray

from raypd.cluster.client.conductor_router import ConductorRouter
from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.launch.local_cluster import ClusterSpec, NodeCluster
from raypd.protocol.sampling_params import SamplingParams
from tests.cluster.helpers import FAST_TRANSFER, assert_idle, collect, kill_and_wait_dead
from tests.conftest import NEW_TOKENS

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
HEARTBEAT_S = 3.0


@pytest.fixture(scope="module")
def cluster():
    c = NodeCluster.start(ClusterSpec(prefill_nodes=2, decode_nodes=1, cpus_per_node=0.5, policy="cost",
                                      engine_options={"num_blocks": 64}, transfer_options=FAST_TRANSFER,
                                      conductor_options={"heartbeat_timeout_s": HEARTBEAT_S,
                                                         "tick_interval_s": 0.2}))
    try:
        yield c
    finally:
        c.stop()


def routed(cluster, rid, ids, route=None):
    """One Conductor decision, then the request on its nodes (or on `route`); delivery is reported.
    Returns (decision, tokens, final chunk)."""
    router = ConductorRouter(cluster.conductor, cluster.nodes)

    async def main():
        with RequestDriver() as driver:
            decision = await cluster.conductor.route.remote(rid, list(ids))
            prefill, decode = (route.prefill, route.decode) if route else \
                (router.nodes.get(decision.prefill_node), router.nodes.get(decision.decode_node))
            tokens, final = await collect(driver, rid, ids, GREEDY, prefill=prefill, decode=decode)
            await router.delivered(rid, final.num_cached_tokens)
            return decision, tokens, final
    return asyncio.run(main())


def wait_indexed(cluster, node_name, min_blocks, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while ray.get(cluster.conductor.status.remote())["nodes"][node_name]["indexed_blocks"] < min_blocks:
        assert time.monotonic() < deadline, f"the index never saw {min_blocks} blocks on {node_name}"
        time.sleep(0.1)


def test_shared_prefix_goes_to_its_holder_and_prediction_holds(cluster, prompt_ids, hf_reference):
    i = max(range(len(prompt_ids)), key=lambda k: len(prompt_ids[k]))
    ids = prompt_ids[i]
    _, tokens, first = routed(cluster, "warm", ids)
    assert tokens == hf_reference[i] and first.error is None
    holder = next(n for n in cluster.by_role("prefill")
                  if ray.get(n.actor.stats.remote())["cached_blocks"] >= len(ids) // 16)
    wait_indexed(cluster, holder.name, len(ids) // 16)
    decision, tokens, final = routed(cluster, "again", ids)
    assert decision.prefill_node == holder.name
    assert decision.predicted_cached_tokens > 0
    assert tokens == hf_reference[i]
    assert final.num_cached_tokens == decision.predicted_cached_tokens
    assert_idle(cluster.nodes)


def test_forced_migration_serves_from_the_copy(cluster, prompt_ids, hf_reference):
    i = max(range(len(prompt_ids)), key=lambda k: len(prompt_ids[k]))
    ids = prompt_ids[i]
    routed(cluster, "warm-for-copy", ids)  # a holder of its own, whatever ran before
    holder = next(n for n in cluster.by_role("prefill")
                  if ray.get(n.actor.stats.remote())["cached_blocks"] >= len(ids) // 16)
    target = next(n for n in cluster.by_role("prefill") if n.name != holder.name)
    ok, error = ray.get(cluster.conductor.copy_prefix.remote(holder.name, target.name, list(ids)), timeout=120)
    assert ok, error
    wait_indexed(cluster, target.name, len(ids) // 16)
    from raypd.cluster.client.router import Route
    decision, tokens, final = routed(cluster, "from-copy", ids,
                                     route=Route(target, cluster.by_role("decode")[0]))
    assert target.name in decision.best_match_nodes
    assert tokens == hf_reference[i]
    assert final.num_cached_tokens == (len(ids) - 1) // 16 * 16
    assert_idle(cluster.nodes)


def test_killed_prefill_node_leaves_routing(cluster, prompt_ids):
    victim = cluster.by_role("prefill")[1]
    kill_and_wait_dead(cluster, victim, HEARTBEAT_S + 10)
    for k, ids in enumerate(prompt_ids):
        d = ray.get(cluster.conductor.route.remote(f"after-{k}", list(ids)))
        assert d.prefill_node != victim.name
