"""NodeCore: what every node actor (prefill, decode, mixed, flex) is made of, whatever its role.

An LLMEngine owned by an EngineLoop thread, TokenStreams to callers (flushed after every tick and
every step), a buffer of the engine's KV events, where the actor runs (HostInfo) and its metrics.
A node actor (node_actor.py) owns one NodeCore and one duty (node_duty.py): start(duty) has the
engine thread tick the duty's stages and hand it every step's outputs, and the actor writes its
Ray-callable methods with the pieces here. Nothing here knows which role it serves.
Only host.py (which asks Ray only when it is initialized), attach_conductor() and a crash touch Ray,
so a node constructs and runs in a plain process.

An engine-thread crash ends the node for good, in this order: every open token stream gets an error
final chunk, every pending one-shot reply (prefill, prefix copies) fails with NodeCrashedError,
ready() and every engine call fail from then on, the Conductor is told the node is dead, and, inside
Ray, the actor kills itself with restart allowed, so Ray starts a fresh incarnation while the
actor's max_restarts lasts (the node pool then re-attaches it). A crashed node never answers
"ready" and never re-registers as idle. A duty whose transfer endpoint is broken (its backend
reaches no peer: kvtransfer/bootstrap/endpoint_health.py) raises EndpointBrokenError
from its tick and takes this path too: only a new process gets a backend that reaches the network.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from raypd.engine.gc_pauses import freeze_heap
from raypd.engine.outputs import StepOutput
from raypd.kvtransfer.config import TransferConfig
from raypd.kvtransfer.data_plane_auth import process_identity
from raypd.kvtransfer.identity import DataPlaneIdentity
from raypd.node.conductor_link import ConductorLink, LinkedNode
from raypd.node.early_aborts import EarlyAborts
from raypd.node.engine_loop import EngineLoop, NodeCrashedError
from raypd.node.gpu_assignment import GpuAssignment, node_device
from raypd.node.host import host_info
from raypd.node.node_duty import DutyLoad, NodeDuty
from raypd.node.node_metrics import NodeMetrics
from raypd.node.streams import Reply, TokenStreams
from raypd.protocol.kv_events import KVEvent
from raypd.protocol.messages import KVEventBatch, LoadReport, NodeRequest, StreamEnd, TokenChunk
from raypd.protocol.queued_by_priority import placed, summarize
from raypd.protocol.roles import Role

log = logging.getLogger(__name__)

RESTART_AFTER_CRASH_S = 0.5  # lets the error chunks and failed replies leave before the process goes
# The engine thread republishes its load this often while it turns (an idle loop turns every 50 ms):
# what probes and heartbeats read without waiting for the engine thread (published_load()).
PUBLISH_EVERY_S = 0.1
# KV events wait here until the Conductor link drains them (every 0.1 s). Without a Conductor (or
# while it is away for long) the oldest are dropped past this many: the Conductor sees the sequence
# gap and re-reads the node's cache from a snapshot, so a bounded buffer loses nothing it needs.
KV_EVENT_BUFFER = 65536
# The first registration's bound in attach_conductor(): the launch (60 s) and the node pool's
# re-attach (30 s) wait on it with bounds of their own, and the shorter of the two wins.
ATTACH_TIMEOUT_S = 60.0


class NodeCore:
    def __init__(self, name: str, role: Role, model: str | None = None, engine_options: dict | None = None,
                 num_cpus: float = 1.0, data_plane_identity: DataPlaneIdentity | None = None, chaos_hooks: bool = False):
        options = dict(engine_options or {})
        # Pin torch to the cores Ray gave this actor: more threads than cores only thrash.
        options.setdefault("num_threads", max(1, int(num_cpus)))
        assignment = GpuAssignment.of_this_actor()
        options["device"] = node_device(options.get("device", "auto"), assignment, name)
        # A Ray actor has its worker process to itself and builds one engine in it: its start-up heap
        # can be frozen (engine/gc_pauses.py). One-process use (tests) builds many: it is not.
        self._owns_process = assignment is not None
        self.name = name
        self.role = role
        # The Ray-callable chaos hooks (crash_engine, fail_requests, hold_steps) answer only when the node
        # was built with them (`raypd serve --chaos-hooks`, the chaos benchmark): in production a caller
        # that reaches a node's actor handle must not be able to crash it, fail or stall its requests.
        self.chaos_hooks = chaos_hooks
        self._kv_events: deque[KVEvent] = deque(maxlen=KV_EVENT_BUFFER)
        from raypd.engine.engine import LLMEngine  # torch: here, in the node's own process

        self.engine = LLMEngine(model, on_kv_event=self._kv_events.append, **options)
        # This node's keys and the peers it admits (kvtransfer/identity.py): every token, bootstrap and
        # KV connection proves with them who it is. The node pool derives them from the deployment's
        # secret, which the node never sees. Without one the node talks only to its own process (tests).
        self.identity = data_plane_identity or process_identity()
        self.streams = TokenStreams(self.identity)
        self.early_aborts = EarlyAborts()   # engine thread: aborts that came before their request
        self.host = host_info()
        self.started_at = time.time()
        self.instance_id = secrets.token_hex(8)  # new for every incarnation of the actor (Ray restarts)
        self._replies: set[Reply] = set()        # one-shot replies still unanswered
        self._replies_lock = threading.Lock()    # added on the actor's loop, failed from the engine thread
        self._failures_to_inject = 0             # fail_requests(): engine thread only
        self._failures_injected = 0
        self.metrics = NodeMetrics()  # records nothing outside Ray
        self._duty: NodeDuty | None = None  # start() sets it
        self.loop = EngineLoop(self.engine, self._tick_and_flush, self._outputs_and_flush, self._on_crash, name)
        self._conductor_link: ConductorLink | None = None
        self._published: tuple[LoadReport, dict] | None = None  # (load, role stats): engine thread writes
        self._next_publish = 0.0

    def start(self, duty: NodeDuty) -> None:
        """Start the engine thread serving `duty` (built on this core)."""
        self._duty = duty
        self._publish(force=True)  # before the thread runs: a probe always finds a report
        if self._owns_process:
            log.info("node %s: %d start-up objects frozen out of the garbage collector's walks", self.name,
                     freeze_heap())
        self.loop.start()

    def transfer_config(self, options: dict | None) -> TransferConfig:
        """The node's kvtransfer options; sockets bind to the node's own IP unless told otherwise, so
        peers on other machines reach them (loopback would only serve one box)."""
        return TransferConfig(**{"host": self.host.ip, **(options or {}), "identity": self.identity})

    # -- from the actor's event loop ----------------------------------------------------------------
    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the engine thread, awaited."""
        return await self.loop.acall(fn, *args)

    def reply(self) -> Reply:
        """A one-shot reply for a Ray call that the engine thread answers; failed if the engine crashes."""
        reply = Reply()
        if self.loop.crashed is not None:
            reply.fail(NodeCrashedError(f"node {self.name}: engine thread crashed: {self.loop.crashed!r}"))
            return reply
        with self._replies_lock:
            self._replies.add(reply)
        return reply

    async def wait(self, reply: Reply) -> Any:
        try:
            return await reply.wait()
        finally:
            with self._replies_lock:
                self._replies.discard(reply)

    def info(self, **extra: Any) -> dict:
        """ready(): identity and shape; answered only once the engine loaded, and never after a crash."""
        if self.loop.crashed is not None:
            raise NodeCrashedError(f"node {self.name}: engine thread crashed: {self.loop.crashed!r}")
        return {"name": self.name, "role": self.role, "host": self.host, "num_blocks": self.engine.num_blocks,
                "block_size": self.engine.config.block_size, "instance_id": self.instance_id,
                "started_at": self.started_at, "kv_seq": self.engine.prefix_cache.event_seq,
                "public_key": self.identity.public_key.decode(), **extra}

    def admit_peers(self, keys: dict[str, str]) -> int:
        """Add principals' public keys (Z85) to this node's allow-list, as the node pool registers
        them (a node it added, or the whole list for a node that restarted); how many it holds."""
        self.identity.peers.admit_all(keys)
        return len(self.identity.peers)

    def crash_engine(self, reason: str = "injected engine crash") -> None:
        """Crash the engine thread for real (chaos tests); the node then fails as after any crash."""
        self.loop.inject_crash(reason)

    def hold_steps(self, seconds: float) -> None:
        """Run no engine step for `seconds`, the node otherwise up (EngineLoop.hold_steps; chaos tests)."""
        self.loop.hold_steps(seconds)

    async def fail_requests(self, n: int) -> int:
        """Fail the next `n` streamed requests at once with an error final chunk, as a node whose
        transfers or engine keep failing while it still answers probes would (the circuit breaker's
        tests); 0 stops it. Returns how many requests the previous setting failed."""
        return await self.loop.acall(self._set_failures_to_inject, max(0, int(n)))

    def _set_failures_to_inject(self, n: int) -> int:
        failed, self._failures_injected = self._failures_injected, 0
        self._failures_to_inject = n
        return failed

    async def stream(self, req: NodeRequest, add: Callable[[NodeRequest], None],
                     abort: Callable[[str, str], object]) -> StreamEnd:
        """Open the request's token stream to req.reply_address, add(req) on the engine thread, and
        return once the request ended, however it ended. Cancelling the call aborts the request."""
        reply = Reply()
        try:
            await self.loop.acall(self._open_stream, req, reply, add)
            return await reply.wait()
        except asyncio.CancelledError:
            self.loop.call(abort, req.request_id, "aborted by the client")
            raise

    async def attach_conductor(self, conductor: Any, node: LinkedNode, timeout_s: float = ATTACH_TIMEOUT_S) -> None:
        """Register `node` (the actor object) with the Conductor, then keep it informed: KV events,
        load reports (heartbeats). The registration waits up to `timeout_s`: its caller (a launch, the
        node pool re-attaching a restarted node) is waiting for it, on a machine that may be loaded,
        so it gets a launch's patience rather than the link's bound on each background call (CI once
        saw a live Conductor answer a launch's registration after more than that)."""
        import ray

        if self._conductor_link is not None:
            self._conductor_link.stop()
        self._conductor_link = ConductorLink(node, conductor, ray.get_runtime_context().current_actor)
        await self._conductor_link.register(timeout_s)
        self._conductor_link.start()

    def shutdown(self) -> None:
        """Stop the Conductor link and the engine thread; the role closes its own endpoints after."""
        if self._conductor_link is not None:
            self._conductor_link.stop()
        self.loop.stop()
        if not self.loop.running:  # the sockets belong to the engine thread while it runs
            self.streams.close()

    def published_load(self) -> LoadReport:
        """The load the engine thread last published (at most PUBLISH_EVERY_S old while it turns) and
        how long its current turn has run (stalled_s). Any thread, never waiting for the engine thread:
        a long step neither delays nor fails the node pool's probe or the Conductor's heartbeat, and a
        step that never ends shows as a growing stalled_s. Also feeds the node's metrics."""
        if self.loop.crashed is not None:
            raise NodeCrashedError(f"node {self.name}: engine thread crashed: {self.loop.crashed!r}")
        assert self._published is not None, "start(duty) publishes the first report"
        report, stats = self._published
        report = replace(report, stalled_s=self.loop.stalled_s())
        self.metrics.observe(report, stats)
        return report

    # -- engine thread ----------------------------------------------------------------------------
    def load_report(self, held: DutyLoad, stats: dict | None = None) -> LoadReport:
        """The engine's load plus what the duty holds outside it, and a flex node's duty; also
        feeds the node's metrics."""
        report = self._report(held)
        self.metrics.observe(report, self._metric_totals(stats or {}))
        return report

    def _metric_totals(self, role_stats: dict) -> dict:
        """What the metrics count: the engine's running totals (retractions, tier traffic) and the duty's."""
        return {**self.engine.totals(), **role_stats}

    def _publish(self, force: bool = False) -> None:
        """Publish the load for published_load(), at most every PUBLISH_EVERY_S."""
        now = time.monotonic()
        if not force and now < self._next_publish:
            return
        assert self._duty is not None, "start(duty) runs the engine thread"
        self._next_publish = now + PUBLISH_EVERY_S
        self._published = (self._report(self._duty.load()), self._metric_totals(self._duty.role_stats()))

    def _report(self, held: DutyLoad) -> LoadReport:
        load = self.engine.load()
        return LoadReport(
            node_name=self.name, role=self.role, queued_prefill_tokens=load.queued_prefill_tokens + held.queued_tokens,
            queued_prefill_by_priority=summarize([*load.queued_by_priority,
                                                  *placed(held.queued_by_priority, held.queued_tokens)]),
            waiting=load.waiting + held.waiting, running=load.running, free_blocks=load.free_blocks,
            total_blocks=load.total_blocks, cached_blocks=load.cached_blocks, inflight=held.inflight,
            step_time_s=self.loop.step_time_s, steps=self.loop.num_steps, step_s_total=self.loop.step_s_total,
            prefill_tokens_per_s=self.loop.tokens_per_s, timestamp=time.time(),
            duty=held.duty, duty_order=held.duty_order, kv_bytes_per_token=load.kv_bytes_per_token,
            tier_load_bytes_per_s=dict(load.tier_load_bytes_per_s))

    def stats(self, **extra: Any) -> dict:
        return {"name": self.name, "role": self.role, **self.engine.stats(),
                "stream_messages": self.streams.num_messages, "stream_dropped": self.streams.num_dropped,
                "early_aborts": {"remembered": len(self.early_aborts), "refused": self.early_aborts.num_refused},
                **extra}

    def check_idle(self, **extra: Any) -> dict:
        """Assert the engine's block accounting adds up; what is still held (zeros when idle)."""
        self.engine.check_block_integrity()
        return {"requests": len(self.engine.requests), "reservations": len(self.engine.reservations),
                "streams": len(self.streams.open_ids()), **extra}

    def drain_kv_events(self) -> KVEventBatch:
        events = tuple(self._kv_events)
        self._kv_events.clear()
        return KVEventBatch(self.name, events)

    def kv_snapshot(self) -> tuple[int, list]:
        """(last KV event seq, BlockStored per cached block); buffered events are superseded by it."""
        self._kv_events.clear()
        return self.engine.prefix_cache.snapshot()

    def _open_stream(self, req: NodeRequest, reply: Reply, add: Callable[[NodeRequest], None]) -> None:
        if not self.streams.open(req.request_id, req.reply_address, reply):
            return
        if self.early_aborts.take(req.request_id) is not None:   # ended before it began: nothing to run
            self.streams.push(TokenChunk(req.request_id, (), finished=True, finish_reason="abort"))
            return
        if self._failures_to_inject > 0:
            self._failures_to_inject -= 1
            self._failures_injected += 1
            self.streams.push(TokenChunk(req.request_id, (), finished=True,
                                         error=f"node {self.name}: injected request failure"))
            return
        try:
            add(req)
        except Exception as e:  # a bug, not a bad request: still end the stream, so the caller hears
            log.exception("adding request %s failed", req.request_id)
            self.streams.push(TokenChunk(req.request_id, (), finished=True, error=f"node {self.name}: {e!r}"))

    def _tick_and_flush(self) -> bool:
        assert self._duty is not None, "start(duty) runs the engine thread"
        busy = self._duty.tick()
        self.streams.flush()  # what the calls and the tick produced: final chunks, first tokens
        self._publish()
        return busy

    def _outputs_and_flush(self, outputs: list[StepOutput]) -> None:
        assert self._duty is not None, "start(duty) runs the engine thread"
        self._duty.on_outputs(outputs)
        self.streams.flush()  # one message per caller per step
        self._publish()

    def _on_crash(self, e: BaseException) -> None:
        """Engine thread, once, as it dies (see the module docstring for the order)."""
        self.streams.end_all(f"node {self.name} crashed: {e!r}")
        error = NodeCrashedError(f"node {self.name}: engine thread crashed: {e!r}")
        with self._replies_lock:
            pending, self._replies = self._replies, set()
        for reply in pending:
            reply.fail(error)
        if self._conductor_link is not None:
            self._conductor_link.report_failed(f"engine crashed: {e!r}")
        self._restart_actor()

    def _restart_actor(self) -> None:
        """Inside Ray: kill this actor with restart allowed, shortly (replies must leave first)."""
        try:
            import ray

            if not ray.is_initialized():
                return
            me = ray.get_runtime_context().current_actor
        except Exception:  # noqa: BLE001 - not an actor (a plain process, a test): nothing to restart
            return

        def kill() -> None:
            log.error("node %s: engine crashed; restarting the actor", self.name)
            ray.kill(me, no_restart=False)

        threading.Timer(RESTART_AFTER_CRASH_S, kill).start()
