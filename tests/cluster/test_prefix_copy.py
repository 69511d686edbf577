"""Prefix copies between prefill nodes over the real NIXL transport (what the Conductor's migration
and remote fetch call): the target then serves the prefix from its own cache with output equal to the
reference; a copy of a prefix the source does not hold fails cleanly on both sides.

On the tiny random-weight model (tests/tiny_model.py), against transformers' greedy output on it: what
is checked is what a copy does to the blocks and the tokens served from them, whatever the weights."""
from __future__ import annotations

import secrets

import pytest
import ray

from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.launch.local_cluster import ClusterSpec, NodeCluster
from raypd.protocol.sampling_params import SamplingParams
from tests.cluster.helpers import FAST_TRANSFER, assert_idle, run_all
from tests.conftest import NEW_TOKENS

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    c = NodeCluster.start(ClusterSpec(model=tiny_model_dir, prefill_nodes=2, decode_nodes=1, cpus_per_node=0.5,
                                      engine_options={"num_blocks": 256}, transfer_options=FAST_TRANSFER))
    try:
        yield c
    finally:
        c.stop()


def copy(source, target, token_ids):
    room = secrets.randbits(63)
    return ray.get([source.actor.export_prefix.remote(token_ids, room, target.name),
                    target.actor.import_prefix.remote(token_ids, room, source.bootstrap_address)], timeout=60)


def test_copied_prefix_serves_requests_on_the_target(cluster, prompt_ids, tiny_reference):
    source, target = cluster.by_role("prefill")
    decode = cluster.by_role("decode")[0]
    i = max(range(len(prompt_ids)), key=lambda k: len(prompt_ids[k]))
    ids = prompt_ids[i]
    driver = RequestDriver()
    (tokens, final), = run_all(driver, [ids], GREEDY, prefill=source, decode=decode)
    assert tokens == tiny_reference[i] and final.num_cached_tokens == 0

    exported, imported = copy(source, target, ids)
    assert exported.ok and imported.ok, (exported.error, imported.error)
    assert imported.num_cached_tokens == len(ids) // 16 * 16
    assert ray.get(target.actor.stats.remote())["prefix_copies"]["imported"] == 1

    (tokens, final), = run_all(driver, [ids], GREEDY, prefill=target, decode=decode)
    assert tokens == tiny_reference[i]
    assert final.num_cached_tokens == (len(ids) - 1) // 16 * 16  # served from the copy
    # The target told its KV events about the copied blocks (the Conductor's index learns from them).
    batch = ray.get(target.actor.drain_kv_events.remote())
    assert sum(len(e.block_hashes) for e in batch.events if hasattr(e, "token_ids")) >= len(ids) // 16
    assert_idle(cluster.nodes)


def test_copy_of_uncached_prefix_fails_cleanly(cluster):
    source, target = cluster.by_role("prefill")
    exported, imported = copy(source, target, list(range(1000, 1064)))
    assert not exported.ok and "not cached" in exported.error
    assert not imported.ok  # the source aborted the room; the target freed its reservation
    assert_idle(cluster.nodes)
