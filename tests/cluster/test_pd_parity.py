"""PD generation on a local Ray cluster with the real NIXL transport equals the Hugging Face reference,
through prefill and decode nodes configured for chunked prefill, a warm prefix cache and retraction;
and afterwards every node's block accounting adds up with nothing left behind.

On the tiny random-weight model (tests/tiny_model.py): what is checked is that splitting a request
across nodes, in each scheduling mode, changes no token, whatever the weights. The real model's
tokens across nodes are test_conductor_routing.py's."""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest
import ray

from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.client.router import RoundRobinRouter
from raypd.cluster.launch.local_cluster import ClusterSpec, NodeCluster
from raypd.protocol.sampling_params import SamplingParams
from tests.cluster.helpers import FAST_TRANSFER, assert_idle, held, paused, run_all, wait_for
from tests.conftest import NEW_TOKENS

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
HANDOFF_PHASES = {"prefill.bootstrap_s", "prefill.queue_s", "prefill.prefill_s", "prefill.transfer_s",
                  "prefill.kv_write_s", "prefill.kv_ack_s", "decode.prealloc_s", "decode.kv_wait_s",
                  "decode.first_step_s"}


@pytest.fixture(scope="module")
def cluster(prompt_ids, tiny_model_dir):
    longest = max(len(ids) for ids in prompt_ids) + NEW_TOKENS
    c = NodeCluster.start(ClusterSpec(model=tiny_model_dir, cpus_per_node=0.5, engine_options={"num_blocks": 512},
                                      transfer_options=FAST_TRANSFER))
    try:
        c.add_nodes(["prefill"])                                                        # prefill-0: defaults
        c.add_nodes(["prefill"], {"chunked_prefill_size": 32, "max_num_batched_tokens": 64})  # prefill-1
        c.add_nodes(["decode"])                                                         # decode-0: defaults
        # decode-1: room for the longest request alone, far too little for all: it must retract.
        c.add_nodes(["decode"], {"num_blocks": -(-longest // 16) + 6, "init_new_token_ratio": 0.05,
                                 "min_new_token_ratio": 0.05})
        yield c
    finally:
        c.stop()


def node(cluster, name):
    return next(n for n in cluster.nodes if n.name == f"raypd-{name}")


def check(results, reference):
    for i, ((tokens, final), ref) in enumerate(zip(results, reference, strict=True)):
        assert final.error is None, f"prompt {i}: {final.error}"
        assert tokens == ref, f"prompt {i}: PD {tokens} != transformers {ref}"
        assert final.finish_reason == ("stop" if len(ref) < NEW_TOKENS else "length")


def test_pd_matches_reference_then_warm_cache(cluster, prompt_ids, tiny_reference):
    driver = RequestDriver()
    route = {"prefill": node(cluster, "prefill-0"), "decode": node(cluster, "decode-0")}
    cold = run_all(driver, prompt_ids, GREEDY, **route)
    check(cold, tiny_reference)
    for _, final in cold:  # the handoff breakdown the PD benchmark reports, phase by phase
        assert HANDOFF_PHASES <= final.timings.keys(), sorted(final.timings)
        assert all(final.timings[k] >= 0 for k in HANDOFF_PHASES)
    warm = run_all(driver, prompt_ids, GREEDY, **route)
    check(warm, tiny_reference)
    for ids, (_, final) in zip(prompt_ids, warm):
        # The prefill node served everything but the block holding the last prompt token from cache.
        assert final.num_cached_tokens == (len(ids) - 1) // 16 * 16
    assert_idle(cluster.nodes)


def test_pd_chunked_prefill(cluster, prompt_ids, tiny_reference):
    driver = RequestDriver()
    check(run_all(driver, prompt_ids, GREEDY, prefill=node(cluster, "prefill-1"), decode=node(cluster, "decode-0")),
          tiny_reference)
    assert_idle(cluster.nodes)


def test_pd_decode_retraction(cluster, prompt_ids, tiny_reference):
    driver = RequestDriver()
    prefill, decode = node(cluster, "prefill-0"), node(cluster, "decode-1")
    # The prompts must reach the decode node together to outgrow its memory together: arriving one by
    # one, each could finish before the next came and nothing would retract. So decode-1 stays frozen
    # until prefill-0 holds every prompt (computed early, waiting for a destination), and then all its
    # generate() calls run at once. How far their decoding overlaps still depends on how the host
    # schedules the processes (one full-suite run in about ten retracted nothing), so the batch runs
    # again, every round checked, until decode-1 has retracted: at most three rounds.
    for _ in range(3):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            with paused(decode):
                results = pool.submit(run_all, driver, prompt_ids, GREEDY, prefill=prefill, decode=decode)
                wait_for(lambda: held(prefill) == len(prompt_ids), "every prompt on the prefill node")
            check(results.result(timeout=300), tiny_reference)
        assert_idle(cluster.nodes)
        if ray.get(decode.actor.stats.remote())["num_retractions"] > 0:
            break
    assert ray.get(decode.actor.stats.remote())["num_retractions"] > 0


def test_the_first_token_comes_from_the_prefill_node_while_the_decode_node_is_frozen(cluster, prompt_ids,
                                                                                     tiny_reference):
    """The driver asks for the first token early (RequestDriver's default): with decode-0 frozen, so no
    KV can land and no decode step can run, the first token still reaches the caller, straight from
    the prefill node; thawed, the stream goes on without repeating it and equals the reference."""
    driver = RequestDriver()
    prefill, decode = node(cluster, "prefill-0"), node(cluster, "decode-0")
    ids, ref = prompt_ids[0], tiny_reference[0]
    got_first = threading.Event()

    async def one():
        tokens, final = [], None
        async for chunk in driver.generate(f"early-{time.monotonic_ns()}", ids, GREEDY, prefill, decode):
            tokens.extend(chunk.token_ids)
            if tokens:
                got_first.set()
            final = chunk
        return tokens, final
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with paused(decode):
            result = pool.submit(asyncio.run, one())
            wait_for(got_first.is_set, "the first token while the decode node is frozen")
        check([result.result(timeout=300)], [ref])
    assert_idle(cluster.nodes)


def test_pd_round_robin_over_two_by_two(cluster, prompt_ids, tiny_reference):
    driver = RequestDriver()
    check(run_all(driver, prompt_ids, GREEDY, router=RoundRobinRouter(cluster.nodes)), tiny_reference)
    stats = ray.get([n.actor.stats.remote() for n in cluster.by_role("prefill")])
    assert all(s["completed"] > 0 for s in stats)
    assert_idle(cluster.nodes)
