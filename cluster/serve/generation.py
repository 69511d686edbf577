"""One request's generations as a single stream of text events, whatever n and the prompt count.

Each choice is routed, driven through the RequestDriver, detokenized incrementally and cut at stop
strings; the choices of a request run concurrently and their events interleave in one stream.
Closing that stream early (the client went away, a stop string was found, another choice failed)
closes every driver iterator still open, and the driver then aborts the request on both nodes.

    for each choice:  route -> driver.generate -> detokenize -> stop strings -> ChoiceEvent ...
                                                                               (last one: finish_reason)

A choice survives node failures (docs/architecture.md, "Failure model"): an attempt that ends with
an error is re-routed around the node the driver blamed (and the nodes this replica's circuit
breaker holds out). Both exclusions fail open (client/failed_nodes.py): a failed node is usable
again once it restarted, or as a last resort while it stays live. When routing finds no node at all
while a node that decodes is restarting (with one decode node, every request), the request waits for
it, up to `recovery_wait_s`, polling the membership: the client sees latency, not a 503.
  - No token reached the client yet: the same request again, up to `retry_limit` times.
  - Tokens were streamed: a replay, up to `migration_limit` times. Its prompt is the prompt plus
    every token generated so far (a prefix-cache hit where the prompt was cached), max_tokens is
    what is left, and num_replayed_tokens tells the engine that those tokens were output (for
    penalties). Sampling noise is a function of (seed, position), and a request without a seed gets
    one here, so greedy and sampled streams both continue exactly where they broke. The client sees
    latency, never a gap, a duplicate or a lost token; usage counts every token once.
A node that refuses for want of capacity (finish_reason OVERLOADED) is not a failure: the circuit
breaker does not count it. Before the first token the request ends at once with OverloadedError
(HTTP 429, retry later: more attempts would only add load); a replay it refuses goes elsewhere.
Retries and replays are routed as already admitted (no SLO rejection of a request under way), and
counted by reason (IngressMetrics.failover: raypd_ingress_retries, raypd_ingress_replays).
"""
from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, replace

from raypd.cluster.client.breaker import CircuitBreaker
from raypd.cluster.client.failed_nodes import FailedNodes
from raypd.cluster.client.node_set import NodeSet
from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.client.router import NoNodeError, Route, Router
from raypd.cluster.openai.api_errors import ServiceUnavailable
from raypd.cluster.openai.deadline import events_until
from raypd.cluster.openai.detokenizer import IncrementalDetokenizer
from raypd.cluster.openai.metrics import FailoverMetrics
from raypd.cluster.openai.params import ChoiceJob, PreparedRequest
from raypd.cluster.openai.response_schema import FinishReason
from raypd.cluster.openai.stop import StopMatcher
from raypd.protocol.errors import OverloadedError
from raypd.protocol.messages import OVERLOADED, TokenChunk
from raypd.protocol.sampling_params import DEFAULT_PRIORITY

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChoiceEvent:
    index: int
    text: str
    finish_reason: FinishReason | None = None  # set on the choice's last event only
    completion_tokens: int = 0        # last event: tokens the nodes generated for this choice
    cached_tokens: int = 0            # last event: prompt tokens served from a prefix cache


ChoiceStream = AsyncGenerator[ChoiceEvent, None]


class Generator:
    """What a request needs from the replica: the driver, the routing seam, the tokenizer, and the
    failure handling's bounds, breaker and view of the membership (`nodes`: which node restarted,
    which is restarting; none: every failed node stays excluded and nothing is waited for)."""

    def __init__(self, driver: RequestDriver, router: Router, hf_tokenizer, retry_limit: int = 3,
                 migration_limit: int = 3, breaker: CircuitBreaker | None = None, nodes: NodeSet | None = None,
                 recovery_wait_s: float = 60.0, recovery_poll_s: float = 0.5, fail_open_after_s: float = 3.0,
                 metrics: FailoverMetrics | None = None):
        self.driver = driver
        self.router = router
        self.hf_tokenizer = hf_tokenizer
        self.retry_limit = retry_limit
        self.migration_limit = migration_limit
        self.breaker = breaker or CircuitBreaker()
        self.nodes = nodes or NodeSet.fixed([])
        self.recovery_wait_s = recovery_wait_s
        self.recovery_poll_s = recovery_poll_s
        self.fail_open_after_s = fail_open_after_s
        self.metrics = metrics or FailoverMetrics()

    def run(self, request_id: str, prepared: PreparedRequest, echo: list[str] | None = None,
            deadline: float | None = None) -> ChoiceStream:
        """Events of every choice, interleaved; `echo` gives each prompt's text to repeat first. Past
        `deadline` (event-loop time) the stream raises GatewayTimeout and every choice is aborted."""
        streams = [self.choice(f"{request_id}-{job.index}", prepared.prompts[job.prompt_index], job,
                               prepared.stops, echo[job.prompt_index] if echo else "")
                   for job in prepared.jobs]
        events = streams[0] if len(streams) == 1 else _interleave(streams)
        return events if deadline is None else events_until(deadline, events)

    async def _route(self, request_id: str, prompt_ids: list[int], failed: FailedNodes,
                     admitted: bool = False, priority: int = DEFAULT_PRIORITY) -> Route:
        """Route around this request's failed nodes and the breaker's open ones. Fail-open, in this
        order: without the breaker's exclusions, then without the failed nodes that failed open; and
        while nothing can serve but a node that decodes may come back (restarting, unresponsive, or
        failed and not yet failed open), wait for it up to recovery_wait_s. `admitted`: a retry or
        replay of a request under way, which admission control does not turn away. `priority`: the
        request's, for the router's queue estimates (the Conductor's SLO admission among them)."""
        route = self.router.reroute if admitted else self.router.route
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.recovery_wait_s
        waited = False
        while True:
            exclusions = failed.for_routing()
            tries = list(dict.fromkeys([exclusions[0] | self.breaker.excluded(), *exclusions]))
            for exclude in tries:
                try:
                    found = await route(request_id, prompt_ids, exclude, priority=priority)
                except NoNodeError as e:
                    no_node = e
                    continue
                if waited:
                    log.info("%s: a node came back after %.1f s", request_id,
                             loop.time() - give_up_at + self.recovery_wait_s)
                return found
            if loop.time() >= give_up_at or not self.nodes.membership.may_recover:
                raise no_node
            if not waited:
                log.warning("%s: no node can serve now (%s); waiting up to %.0f s for one to come back",
                            request_id, no_node, self.recovery_wait_s)
                waited = True
                self.metrics.recovery_waits.inc(1)
            await asyncio.sleep(self.recovery_poll_s)

    async def choice(self, request_id: str, prompt_ids: list[int], job: ChoiceJob, stops: tuple[str, ...],
                     echo: str = "") -> ChoiceStream:
        detok = IncrementalDetokenizer(self.hf_tokenizer)
        matcher = StopMatcher(stops)
        params = job.params if job.params.seed is not None or job.params.greedy else \
            replace(job.params, seed=secrets.randbits(63))  # a replay continues the same random stream
        if echo:
            yield ChoiceEvent(job.index, echo)
        generated: list[int] = []   # every token the nodes produced for this choice, in order
        cached: int | None = None   # the first attempt's prompt cache hit (what usage reports)
        failed_nodes = FailedNodes(self.nodes, self.fail_open_after_s)
        retries = migrations = 0
        attempt = 0
        while True:
            attempt_id = request_id if attempt == 0 else f"{request_id}-retry{attempt}"
            attempt += 1
            route = await self._route(attempt_id, prompt_ids + generated, failed_nodes, attempt > 1, params.priority)
            attempt_params = params if not generated else replace(
                params, max_tokens=params.max_tokens - len(generated), num_replayed_tokens=len(generated))
            failure: TokenChunk | None = None
            stream = self.driver.generate(attempt_id, prompt_ids + generated, attempt_params, route.prefill,
                                          route.decode)
            # Leaving early closes the driver's stream, which aborts the request on both nodes.
            async with aclosing(stream):
                async for chunk in stream:
                    if chunk.finished and chunk.error:
                        failure = chunk
                        break
                    generated.extend(chunk.token_ids)
                    if cached is None and chunk.finished:
                        cached = chunk.num_cached_tokens
                        if attempt_params.num_replayed_tokens:  # a replay's hit may cover generated tokens
                            cached = min(cached, len(prompt_ids))
                    if chunk.finished:
                        await self.router.delivered(attempt_id, chunk.num_cached_tokens)
                        for node in (route.prefill, route.decode):
                            if node is not None:
                                self.breaker.success(node.name)
                    if chunk.finished and chunk.finish_reason not in ("stop", "length"):
                        raise ServiceUnavailable(f"the request failed on the cluster: {chunk.finish_reason}",
                                                 code="node_failure")
                    ids = chunk.token_ids
                    if chunk.finished and chunk.finish_reason == "stop" and ids:
                        ids = ids[:-1]  # the stop token (EOS or a stop_token_id) is not part of the text
                    text = detok.add(ids) + (detok.flush() if chunk.finished else "")
                    released = matcher.feed(text)
                    if matcher.stopped:
                        yield ChoiceEvent(job.index, released, "stop", len(generated), cached or 0)
                        return
                    if chunk.finished:
                        reason: FinishReason = "stop" if chunk.finish_reason == "stop" else "length"
                        yield ChoiceEvent(job.index, released + matcher.flush(), reason, len(generated),
                                          cached or 0)
                        return
                    if released:
                        yield ChoiceEvent(job.index, released)
            if failure is None:
                raise ServiceUnavailable("the cluster ended the request without a final message", code="node_failure")
            if failure.finish_reason == OVERLOADED and not generated:
                raise OverloadedError(failure.error or "a node is full", failure.failed_node)
            why = self._reason(failure)
            if failure.failed_node:
                failed_nodes.add(failure.failed_node)
                if failure.finish_reason != OVERLOADED:
                    self.breaker.failure(failure.failed_node)
            if len(generated) >= params.max_tokens:  # every token arrived, only the end was lost
                yield ChoiceEvent(job.index, matcher.feed(detok.flush()) + matcher.flush(), "length",
                                  len(generated), cached or 0)
                return
            if generated:
                migrations += 1
                if migrations > self.migration_limit:
                    raise ServiceUnavailable(f"the request failed on the cluster after {migrations - 1} "
                                             f"replays: {failure.error}", code="node_failure")
                self.metrics.replays.inc(1, {"reason": why})
                log.warning("%s: %s; replaying %d generated tokens elsewhere", request_id, failure.error,
                            len(generated))
            else:
                retries += 1
                if retries > self.retry_limit:
                    raise ServiceUnavailable(f"the request failed on the cluster after {retries - 1} "
                                             f"retries: {failure.error}", code="node_failure")
                self.metrics.retries.inc(1, {"reason": why})
                log.warning("%s: %s; retrying on other nodes", request_id, failure.error)

    def _reason(self, failure: TokenChunk) -> str:
        """The metrics' reason for a failed attempt: `overloaded`, `<role>_node_failed` for the node
        the driver blamed, or `unattributed`."""
        if failure.finish_reason == OVERLOADED:
            return "overloaded"
        member = self.nodes.membership.by_name.get(failure.failed_node or "")
        if member is not None:
            return f"{member.node.role}_node_failed"
        return "node_failed" if failure.failed_node else "unattributed"


async def _interleave(streams: list[ChoiceStream]) -> ChoiceStream:
    """Events of all streams as they come. The first failure ends everything: the other streams'
    tasks are cancelled, which closes their driver streams (abort on the nodes)."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream: ChoiceStream) -> None:
        try:
            async with aclosing(stream):
                async for event in stream:
                    await queue.put(event)
        except Exception as e:  # noqa: BLE001 - handed to the reader, which raises it
            await queue.put(e)
        finally:
            queue.put_nowait(done)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is done:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
