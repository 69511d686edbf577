"""PD failures on a local Ray cluster with the real NIXL transport: aborts in each queue state, a
transfer timeout, a prefill node killed with requests queued and in flight (and, deterministically,
with rooms in BOOTSTRAP and INFLIGHT while its decode node is frozen by SIGSTOP), a decode node
killed mid-stream. Each affected request ends with a clear final message; unaffected ones finish equal to
the reference; afterwards every surviving node holds nothing and its block accounting adds up.

The nodes serve the tiny random-weight model (tests/tiny_model.py), against transformers' greedy
output on it: what is checked is what each failure does to the queues, rooms and streams, whatever
the weights. Where a request must stay in a queue while the test acts, its prefill node's
`hold_steps` chaos hook keeps the node from stepping (a slow node, on any model), where a slow
prefill of the 135 M model used to give the test its time."""
from __future__ import annotations

import asyncio
import secrets

import pytest
import ray

from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.launch.local_cluster import ClusterSpec, NodeCluster
from raypd.protocol.messages import NodeRequest
from raypd.protocol.sampling_params import SamplingParams
from tests.cluster.helpers import (
    FAST_TRANSFER,
    assert_idle,
    collect,
    held,
    paused,
    process_gone,
    queues,
    wait_for,
)
from tests.conftest import NEW_TOKENS
from tests.node.pd import TokenSink

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes

GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
ENDLESS = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
FAIL_FAST = {**FAST_TRANSFER, "bootstrap_timeout_s": 20.0}
HANG_GUARD_S = 90  # a request still open after this is a hang, whatever the machine's speed
HOLD_S = 60.0      # a node's steps held (hold_steps) for at most this; each test ends its holds
# A long prompt: ~50 prefill steps of 16 tokens on the slow prefill nodes.
SLOW_PROMPT = list(range(1000, 1800))
OTHER_SLOW_PROMPT = list(range(2000, 2800))   # as long, sharing no prefix with SLOW_PROMPT


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    # Room for the three fixture nodes plus two per test (ray_cpus: logical CPUs, cores are shared).
    c = NodeCluster.start(ClusterSpec(model=tiny_model_dir, cpus_per_node=0.5, engine_options={"num_blocks": 256},
                                      transfer_options=FAIL_FAST, ray_cpus=3, chaos_hooks=True))
    try:
        c.add_nodes(["prefill", "decode"])  # prefill-0, decode-0: the healthy pair
        # prefill-1 computes 16 tokens per step, so a long prompt stays queued for a while.
        c.add_nodes(["prefill"], {"chunked_prefill_size": 16, "max_num_batched_tokens": 16})
        yield c
    finally:
        c.stop()


def node(cluster, name):
    return next(n for n in cluster.nodes if n.name == f"raypd-{name}")


def request(ids, params=GREEDY, prefill=None, sink: TokenSink | None = None) -> NodeRequest:
    rid = f"t-{secrets.token_hex(4)}"
    return NodeRequest(rid, secrets.randbits(63), tuple(ids), params,
                       bootstrap_address=prefill.bootstrap_address if prefill else "",
                       reply_address=sink.address if sink else "")


def final_of(sink: TokenSink, generate_ref) -> list:
    """Wait for a decode node's generate() and return the chunks its token stream carried: exactly
    one final chunk, the last, equal to the one generate() returned, and the tokens it counted."""
    end = ray.get(generate_ref, timeout=HANG_GUARD_S)
    chunks = sink.chunks(end.final.request_id, HANG_GUARD_S)
    assert chunks and chunks[-1].finished and sum(c.finished for c in chunks) == 1
    assert chunks[-1] == end.final and sum(len(c.token_ids) for c in chunks) == end.num_tokens
    return chunks


def hold_steps(n, seconds: float) -> None:
    ray.get(n.actor.hold_steps.remote(seconds), timeout=30)


def destination_blocks(n) -> int:
    """Decode-side blocks named by the destinations a prefill node's sender holds."""
    return ray.get(n.actor.stats.remote(), timeout=30)["transfer"]["held_blocks"]


def long_prompt(prompt_ids):
    return max(prompt_ids, key=len)


@pytest.fixture(scope="module")
def frozen_decode_pair(cluster):
    """A slow prefill node (16 tokens per step) whose sender tolerates a frozen peer for a minute, and a
    decode node to freeze: a room stays INFLIGHT while its decode node cannot send Done. One pair for
    the module's two tests on it (started once, not per test): the first leaves both idle (asserted),
    the second kills the prefill node and removes both; whatever is left goes at the module's end."""
    prefill = cluster.add_nodes(["prefill"], {"chunked_prefill_size": 16, "max_num_batched_tokens": 16},
                                {"heartbeat_timeout_s": 60.0, "transfer_timeout_s": 60.0})[0]
    decode = cluster.add_nodes(["decode"])[0]
    try:
        yield prefill, decode
    finally:
        for n in (prefill, decode):
            if n in cluster.nodes:
                ray.kill(n.actor)
                cluster.remove(n)


def test_abort_in_prefill_before_the_destination_and_queued(cluster, prompt_ids, sink):
    slow = node(cluster, "prefill-1")
    # No decode node ever sends a destination: computed early, the write armed (BOOTSTRAP itself, with
    # early admission off, is tested on the node: tests/node/test_pd_one_process.py).
    req = request(prompt_ids[0])
    result = slow.actor.prefill.remote(req)
    wait_for(lambda: held(slow) == 1, "the request on the node")
    ray.get(slow.actor.abort.remote(req.request_id), timeout=30)
    res = ray.get(result, timeout=HANG_GUARD_S)
    assert not res.ok and "aborted by the client" in res.error
    # QUEUED: the destination arrived, the long prompt waits for its prefill (the node held).
    decode = node(cluster, "decode-0")
    req = request(long_prompt(prompt_ids), prefill=slow, sink=sink)
    hold_steps(slow, HOLD_S)
    try:
        result = slow.actor.prefill.remote(req)
        decoding = decode.actor.generate.remote(req)
        # Queued early, it may still wait for its destination: abort once the destination is here, or
        # the sender has no peer to tell and the decode side hears only when the destination expires
        # there as an orphan (bootstrap_timeout_s; kvtransfer/test_two_process.py tests that).
        wait_for(lambda: queues(slow)["queued"] == 1 and destination_blocks(slow) > 0, "prefill queue, destination")
        ray.get(slow.actor.abort.remote(req.request_id), timeout=30)
    finally:
        hold_steps(slow, 0)
    res = ray.get(result, timeout=HANG_GUARD_S)
    assert not res.ok and "aborted by the client" in res.error
    chunks = final_of(sink, decoding)  # the decode side learns the room was aborted
    assert chunks[-1].error and "abort" in chunks[-1].error
    assert_idle(cluster.nodes)


def test_abort_in_decode_prealloc_transfer_and_running(cluster, prompt_ids, sink):
    prefill = node(cluster, "prefill-0")
    small = cluster.add_nodes(["decode"], {"num_blocks": 40})[0]
    try:
        # TRANSFER: a 30-block prompt whose prefill never starts holds its reservation...
        blocker = request(list(range(1, 30 * 16 + 1)), prefill=prefill, sink=sink)
        blocker_end = small.actor.generate.remote(blocker)
        wait_for(lambda: queues(small)["transfer"] == 1, "transfer queue")
        # ...so a 20-block prompt waits in PREALLOC (back-pressure).
        waiting = request(list(range(1, 20 * 16 + 1)), prefill=prefill, sink=sink)
        waiting_end = small.actor.generate.remote(waiting)
        wait_for(lambda: queues(small)["prealloc"] == 1, "prealloc queue")
        ray.get(small.actor.abort.remote(waiting.request_id), timeout=30)
        assert final_of(sink, waiting_end)[-1].finish_reason == "abort"
        ray.get(small.actor.abort.remote(blocker.request_id), timeout=30)
        assert final_of(sink, blocker_end)[-1].finish_reason == "abort"
        # RUNNING: the client goes away mid-stream; the driver aborts on both nodes.
        driver = RequestDriver()

        async def read_two_chunks_then_leave():
            gen = driver.generate("leaver", prompt_ids[1], ENDLESS, prefill=prefill, decode=small)
            got = [await gen.__anext__() for _ in range(2)]
            await gen.aclose()
            await asyncio.sleep(0.5)  # let the fire-and-forget aborts go out
            return got
        assert all(not c.finished for c in asyncio.run(read_two_chunks_then_leave()))
        assert_idle([prefill, small])
    finally:
        ray.kill(small.actor)
        cluster.remove(small)


def test_abort_in_prefill_inflight(frozen_decode_pair, prompt_ids, sink):
    prefill, decode = frozen_decode_pair
    # The pair stays for the next test; no prefix of this prompt is left cached for it.
    req = request(OTHER_SLOW_PROMPT, ENDLESS, prefill=prefill, sink=sink)
    hold_steps(prefill, HOLD_S)   # QUEUED until the decode node is frozen
    result = prefill.actor.prefill.remote(req)
    decoding = decode.actor.generate.remote(req)
    wait_for(lambda: queues(prefill)["queued"] == 1, "prefill queue")
    with paused(decode):  # the KV goes out but no Done can come back
        hold_steps(prefill, 0)
        wait_for(lambda: queues(prefill)["inflight"] == 1, "inflight queue", HANG_GUARD_S)
        # The client goes away; like the driver, abort on both sides (the decode node's call waits
        # in its mailbox until it runs again).
        ray.get(prefill.actor.abort.remote(req.request_id), timeout=30)
        decode_abort = decode.actor.abort.remote(req.request_id)
        # Blocks stay held while a write may still be reading them: ABORTING, or already ended.
        assert queues(prefill)["inflight"] == 0
    res = ray.get(result, timeout=HANG_GUARD_S)
    assert not res.ok and "aborted by the client" in res.error
    ray.get(decode_abort, timeout=30)
    # Two notices race once the decode node runs again: its own abort call (from its mailbox) and
    # the prefill node's "aborted by the sender" on the room. Either way the stream ends without a
    # token and names the client's abort.
    final = final_of(sink, decoding)[-1]
    assert not final.token_ids and (final.finish_reason == "abort" or (
        final.error is not None and final.error.endswith("aborted by the sender: aborted by the client"))), final
    assert_idle([prefill, decode])


def test_prefill_killed_with_rooms_in_bootstrap_and_inflight(cluster, frozen_decode_pair, prompt_ids, sink):
    prefill, decode = frozen_decode_pair
    try:
        inflight = request(SLOW_PROMPT, prefill=prefill, sink=sink)
        hold_steps(prefill, HOLD_S)   # QUEUED until the decode node is frozen
        inflight_result = prefill.actor.prefill.remote(inflight)
        inflight_end = decode.actor.generate.remote(inflight)
        wait_for(lambda: queues(prefill)["queued"] == 1, "prefill queue")
        with paused(decode):
            hold_steps(prefill, 0)
            wait_for(lambda: queues(prefill)["inflight"] == 1, "inflight queue", HANG_GUARD_S)
            # A second room waits for its destination (computed early meanwhile): its decode node is
            # frozen and cannot send one.
            waiting = request(prompt_ids[0], prefill=prefill, sink=sink)
            waiting_result = prefill.actor.prefill.remote(waiting)
            waiting_end = decode.actor.generate.remote(waiting)
            wait_for(lambda: held(prefill) == 2, "the second request on the node")
            ray.kill(prefill.actor)
            # ray.kill only asks the raylet; a prefill process still running when the decode node thaws
            # would get the destination and write the KV. Thaw only once it can run no more code.
            wait_for(lambda: process_gone(prefill.host.pid), "the killed prefill process to end", HANG_GUARD_S)
        for ref in (inflight_result, waiting_result):
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(ref, timeout=HANG_GUARD_S)
        # The in-flight room's KV may have landed whole before the kill (the write needs nothing from
        # the frozen side on this transport): then the decode node rightly goes on; else it fails.
        chunks = final_of(sink, inflight_end)
        tokens = [t for c in chunks for t in c.token_ids]
        assert chunks[-1].error or (chunks[-1].finish_reason in ("stop", "length") and tokens)
        final = final_of(sink, waiting_end)[-1]
        assert final.error and "sender" in final.error and not final.token_ids
        assert_idle([decode])
    finally:
        for n in (prefill, decode):
            ray.kill(n.actor)
            cluster.remove(n)


def test_transfer_wait_timeout(cluster, prompt_ids, tiny_reference):
    impatient = cluster.add_nodes(["decode"], transfer_options={"wait_timeout_s": 0.3})[0]
    slow, healthy = node(cluster, "prefill-1"), node(cluster, "prefill-0")
    hold_steps(slow, HOLD_S)   # its KV would come long after the impatient node's 0.3 s
    try:
        driver = RequestDriver()

        async def main():
            timed_out = [collect(driver, f"slow-{i}", long_prompt(prompt_ids), GREEDY, prefill=slow, decode=impatient)
                         for i in range(2)]
            fine = [collect(driver, f"fine-{i}", prompt_ids[i], GREEDY, prefill=healthy, decode=node(cluster, "decode-0"))
                    for i in range(4)]
            return await asyncio.wait_for(asyncio.gather(*timed_out, *fine), HANG_GUARD_S)
        results = asyncio.run(main())
        for tokens, final in results[:2]:
            # No KV ever landed; at most the first token came, early from the prefill node, if its
            # prefill ended before it heard of the timeout.
            assert final.error and "timeout" in final.error and len(tokens) <= 1
        for i, (tokens, final) in enumerate(results[2:]):
            assert final.error is None and tokens == tiny_reference[i]
        hold_steps(slow, 0)
        assert_idle(cluster.nodes)
    finally:
        hold_steps(slow, 0)
        ray.kill(impatient.actor)
        cluster.remove(impatient)


def test_prefill_killed_with_requests_queued_and_in_flight(cluster, prompt_ids, tiny_reference):
    # 16 tokens per step: every prompt queued on it takes a few hundred steps in all.
    victim = cluster.add_nodes(["prefill"], {"chunked_prefill_size": 16, "max_num_batched_tokens": 16})[0]
    decode, healthy = node(cluster, "decode-0"), node(cluster, "prefill-0")
    driver = RequestDriver()

    async def main():
        doomed = [asyncio.ensure_future(collect(driver, f"doomed-{i}", ids, GREEDY, prefill=victim, decode=decode))
                  for i, ids in enumerate(prompt_ids)]
        fine = [asyncio.ensure_future(collect(driver, f"fine-{i}", ids, GREEDY, prefill=healthy, decode=decode))
                for i, ids in enumerate(prompt_ids[:4])]
        while not ray.get(victim.actor.stats.remote())["completed"]:  # kill once some KV has gone across
            await asyncio.sleep(0.01)
        await victim.actor.hold_steps.remote(HOLD_S)   # the rest stays queued until the kill lands
        ray.kill(victim.actor)
        return await asyncio.wait_for(asyncio.gather(*doomed), HANG_GUARD_S), \
            await asyncio.wait_for(asyncio.gather(*fine), HANG_GUARD_S)
    try:
        doomed, fine = asyncio.run(main())
    finally:
        cluster.remove(victim)
    failed = [final for _, final in doomed if final.error]
    assert failed, "killing the prefill node failed no request"
    for i, (tokens, final) in enumerate(doomed):
        assert final.error or tokens == tiny_reference[i]  # finished before the kill, or failed cleanly
    assert all("transfer failed" in f.error or "failed" in f.error for f in failed)
    for i, (tokens, final) in enumerate(fine):
        assert final.error is None and tokens == tiny_reference[i]
    assert_idle(cluster.nodes)


def test_decode_killed_mid_stream(cluster, prompt_ids, tiny_reference):
    victim = cluster.add_nodes(["decode"])[0]
    prefill, healthy = node(cluster, "prefill-0"), node(cluster, "decode-0")
    driver = RequestDriver()

    async def main():
        started = asyncio.Event()

        async def doomed(i, ids):
            tokens = []
            async for chunk in driver.generate(f"doomed-{i}", ids, ENDLESS, prefill=prefill, decode=victim):
                tokens += chunk.token_ids
                if tokens:
                    started.set()
                if chunk.finished:
                    return tokens, chunk
        tasks = [asyncio.ensure_future(doomed(i, ids)) for i, ids in enumerate(prompt_ids[:6])]
        fine = [asyncio.ensure_future(collect(driver, f"fine-{i}", ids, GREEDY, prefill=prefill, decode=healthy))
                for i, ids in enumerate(prompt_ids[:4])]
        await asyncio.wait_for(started.wait(), HANG_GUARD_S)
        ray.kill(victim.actor)
        return await asyncio.wait_for(asyncio.gather(*tasks), HANG_GUARD_S), \
            await asyncio.wait_for(asyncio.gather(*fine), HANG_GUARD_S)
    try:
        doomed, fine = asyncio.run(main())
    finally:
        cluster.remove(victim)
    for _, final in doomed:
        assert final.error and victim.name in final.error
    for i, (tokens, final) in enumerate(fine):
        assert final.error is None and tokens == tiny_reference[i]
    assert_idle(cluster.nodes)  # prefill-0 freed the rooms it was sending to the dead node


def test_a_prefill_node_that_refuses_without_a_room_fails_the_request_at_once(cluster, prompt_ids):
    """The prefill node cannot take the prompt (more KV than its pool holds) and answers at once with
    no room opened: the driver aborts the decode side then, instead of leaving it waiting out its
    bootstrap timeout (20 s here), and holds the prefill node responsible."""
    small = cluster.add_nodes(["prefill"], {"num_blocks": 8})[0]   # 128 tokens of KV
    decode = node(cluster, "decode-0")
    driver = RequestDriver()
    try:
        tokens, final = asyncio.run(asyncio.wait_for(
            collect(driver, "refused", SLOW_PROMPT[:300], GREEDY, prefill=small, decode=decode),
            HANG_GUARD_S))
        assert not tokens and final.failed_node == small.name
        assert f"prefill node {small.name} refused the request" in final.error and "KV blocks" in final.error
        assert_idle([small, decode])
    finally:
        driver.close()
        ray.kill(small.actor)
        cluster.remove(small)


def test_a_hung_prefill_node_is_blamed_not_the_decode_node_that_timed_out(cluster, prompt_ids):
    """SIGSTOP of the prefill node before the request reaches it: the decode side's bootstrap times
    out (3 s) and ends the request with its own error; the prefill node stays silent past the
    driver's wait (1 s), so the driver holds it responsible: retries avoid it and the breaker counts
    it, not the healthy decode node."""
    prefill = cluster.add_nodes(["prefill"])[0]
    decode = cluster.add_nodes(["decode"], transfer_options={"bootstrap_timeout_s": 3.0})[0]
    driver = RequestDriver(prefill_wait_s=1.0)
    try:
        with paused(prefill):
            tokens, final = asyncio.run(asyncio.wait_for(
                collect(driver, "hung", prompt_ids[0], GREEDY, prefill=prefill, decode=decode), HANG_GUARD_S))
        assert not tokens and final.error and final.failed_node == prefill.name
        assert_idle([prefill, decode])   # thawed, the prefill node finds the request aborted
    finally:
        driver.close()
        for n in (prefill, decode):
            ray.kill(n.actor)
            cluster.remove(n)
