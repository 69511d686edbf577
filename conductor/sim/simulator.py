"""One simulated run: requests arrive, the real ConductorCore routes them, simulated nodes serve.

Event loop on a virtual clock (a heap of (time, order, kind, payload)). The wiring mirrors the
cluster: a node's KV events and load reports reach the Conductor in batches at most every
report_interval_s after a change (so the Conductor sees stale load, as it would); fetches
(Branch B) and migrations copy blocks node to node through the source's NIC, and the target's
cache publishes them; the Conductor learns of copies only from those events. A policy name may
carry suffixes: `+migration` (hot-prefix migration on), `+local` (split or local per request,
conductor/split_or_local.py: a decision on the local path prefills on its decode node) and `+flex`
(every node is a flex node, started in the given prefill/decode proportion, whose duty the
Conductor's DutyPlanner moves; its decode pressure threshold is 0.8 x the profile's TPOT SLO).

A simulated flex node is a SimPrefillNode and a SimDecodeNode under one name and host. The
Conductor routes it as its duty, so settled, only one half gets work; while it drains, both halves
may hold work and each runs at full speed (an optimistic drain: the real node shares one engine).
A drain ends when the old half holds nothing, checked at the node's reports and every tick. Its
memory serves one duty at a time: settling into decode empties the prefill half's prefix cache
(published as removed blocks), so a flex fleet holds no more cache than a fixed one. `busy_share`
then counts every node as a possible prefill node.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raypd.conductor.config import TPOT_TARGET_SHARE, DutyPlannerConfig, LocalPrefillConfig
from raypd.conductor.core import ConductorCore
from raypd.conductor.errors import AdmissionRejected
from raypd.conductor.planners.migration import MigrationPlan
from raypd.conductor.sim.nodes import Job, Outcome, SimDecodeNode, SimPrefillNode
from raypd.conductor.sim.profiles import HardwareProfile, build_topology, conductor_config
from raypd.conductor.sim.workload import SimRequest
from raypd.conductor.topology import Topology, transfer_seconds
from raypd.protocol.duty import Duty
from raypd.protocol.messages import HostInfo, KVEventBatch, LoadReport
from raypd.protocol.roles import Role

ARRIVE, PREFILL_DONE, KV_LANDED, DECODE_TICK, REPORT, COPY_DONE, SAMPLE, TICK = range(8)


@dataclass(slots=True)
class RunResult:
    policy: str
    outcomes: list[Outcome]
    imbalance: list[float]               # max / mean of prefill queues, per sample with load
    decision_latency_s: list[float]
    branches: dict[str, int]
    rejected: int
    migrations: dict[str, int]
    fetches: int
    copy_bytes: int
    wall_s: float
    busy_share: float                    # prefill nodes' busy time / (nodes x makespan)
    extra: dict = field(default_factory=dict)


class Simulation:
    def __init__(self, profile: HardwareProfile, policy: str, *, prefill_nodes: int, decode_nodes: int,
                 block_size: int = 16, unit: int = 1, migration: bool = False, report_interval_s: float = 0.05,
                 sample_interval_s: float = 1.0, tick_interval_s: float = 1.0, config_overrides: dict | None = None,
                 migration_overrides: dict | None = None, local_prefill_budget: int = 32):
        self.profile = profile
        self.unit = unit
        self.block_size = block_size
        self.now = 0.0
        self.report_interval_s = report_interval_s
        self.sample_interval_s = sample_interval_s
        self.tick_interval_s = tick_interval_s
        n = prefill_nodes + decode_nodes
        self.topology, hosts = build_topology(profile, n)
        # interleave roles over hosts so every host has both (as a mixed deployment would)
        roles = [Role.PREFILL] * prefill_nodes + [Role.DECODE] * decode_nodes
        order = _interleave(prefill_nodes, decode_nodes)
        self.prefill: dict[str, SimPrefillNode] = {}
        self.decode: dict[str, SimDecodeNode] = {}
        base, *flags = policy.split("+")
        budget = max(1, local_prefill_budget // unit)     # in the run's token unit
        overrides = dict(config_overrides or {})
        if "local" in flags:
            overrides["local_prefill"] = LocalPrefillConfig(enabled=True, step_budget_tokens=budget)
        flex = "flex" in flags
        if flex and "duties" not in overrides:
            overrides["duties"] = DutyPlannerConfig(min_prefill_nodes=0 if "local" in flags else 1,
                                                    decode_busy_step_s=TPOT_TARGET_SHARE * profile.tpot_slo_s)
        self.duty: dict[str, Duty] = {}          # flex nodes' duty, as the node itself holds it
        self.duty_order: dict[str, float] = {}   # and the stamp of the order it last took
        cfg = conductor_config(profile, base, migration=migration or "migration" in flags,
                               block_size=block_size, migration_overrides=migration_overrides, **overrides)
        self.core = ConductorCore(cfg, self.topology, clock=lambda: self.now)
        self.policy_name = policy
        self.nodes: dict[str, SimPrefillNode | SimDecodeNode] = {}
        for i, k in enumerate(order):
            host = hosts[i]
            node: SimPrefillNode | SimDecodeNode
            if flex:
                name = f"f{i}"
                self.prefill[name] = node = SimPrefillNode(name, host, profile, block_size)
                self.decode[name] = SimDecodeNode(name, host, profile, block_size, unit, budget)
                self.nodes[name] = node
                self.duty[name], self.duty_order[name] = Duty.parse(roles[k].value), 0.0
                self.core.register_node(name, Role.FLEX, HostInfo(host, "", host, 0), duty=self.duty[name])
                continue
            if roles[k] is Role.PREFILL:
                node = SimPrefillNode(f"p{len(self.prefill)}", host, profile, block_size)
                self.prefill[node.name] = node
            else:
                node = SimDecodeNode(f"d{len(self.decode)}", host, profile, block_size, unit, budget)
                self.decode[node.name] = node
            self.nodes[node.name] = node
            self.core.register_node(node.name, roles[k], HostInfo(host, "", host, 0))
        self._heap: list = []
        self._order = itertools.count()
        self._report_due: set[str] = set()
        self.outcomes: list[Outcome] = []
        self.imbalance: list[float] = []
        self.latencies: list[float] = []
        self.branches: dict[str, int] = {}
        self.rejected = 0
        self.fetches = 0
        self.copy_bytes = 0             # fetches and migrations, not the KV sent to decode nodes
        self._pending_arrivals = 0
        self._unfinished = 0

    # -- plumbing -----------------------------------------------------------------------------
    def _at(self, t: float, kind: int, payload=None) -> None:
        heapq.heappush(self._heap, (t, next(self._order), kind, payload))

    def _dirty(self, name: str) -> None:
        if name not in self._report_due:
            self._report_due.add(name)
            self._at(self.now + self.report_interval_s, REPORT, name)

    def _transfer_s(self, src: str, dst: str, tokens: float) -> float:
        a, b = self.nodes[src], self.nodes[dst]
        if src == dst:
            return 0.0
        t: Topology = self.topology
        i, j = t.host_index(a.host), t.host_index(b.host)
        return transfer_seconds(tokens * self.profile.kv_bytes_per_token, t.bandwidth[i, j], t.latency[i, j])

    # -- run ----------------------------------------------------------------------------------
    def run(self, requests: list[SimRequest], time_scale: float = 1.0) -> RunResult:
        wall = time.perf_counter()
        for r in requests:
            self._at(r.arrival_s / time_scale, ARRIVE, r)
        self._pending_arrivals = len(requests)
        self._unfinished = len(requests)
        self._at(0.0, SAMPLE)
        self._at(self.tick_interval_s, TICK)
        handlers: dict[int, Callable[[Any], None]] = {ARRIVE: self._arrive, PREFILL_DONE: self._prefill_done, KV_LANDED: self._kv_landed,
                    DECODE_TICK: self._decode_tick, REPORT: self._report, COPY_DONE: self._copy_done,
                    SAMPLE: self._sample, TICK: self._tick}
        while self._heap and self._unfinished > 0:
            t, _, kind, payload = heapq.heappop(self._heap)
            self.now = t
            handlers[kind](payload)
        busy = sum(p.busy_s for p in self.prefill.values())
        span = max(self.now, 1e-9)
        pl = self.core.planner
        extra = {"duty_orders": [o.to_dict() for o in self.core.duties.orders],
                 "final_duties": dict(Counter(d.value for d in self.duty.values()))} if self.duty else {}
        return RunResult(
            policy=self.policy_name, outcomes=self.outcomes, imbalance=self.imbalance,
            decision_latency_s=self.latencies, branches=self.branches, rejected=self.rejected,
            migrations={"started": pl.started, "finished": pl.finished, "failed": pl.failed},
            fetches=self.fetches, copy_bytes=self.copy_bytes,
            wall_s=time.perf_counter() - wall, busy_share=busy / (len(self.prefill) * span), extra=extra)

    # -- handlers -----------------------------------------------------------------------------
    def _arrive(self, req: SimRequest) -> None:
        self._pending_arrivals -= 1
        try:
            d = self.core.route(req.request_id, req.token_ids())
        except AdmissionRejected:
            self.rejected += 1
            self._unfinished -= 1
            return
        self.latencies.append(d.latency_s)
        self.branches[d.branch] = self.branches.get(d.branch, 0) + 1
        out = Outcome(req, arrival=self.now, prefill=d.prefill_node, decode=d.decode_node, branch=d.branch,
                      predicted_cached=d.predicted_cached_tokens)
        self.outcomes.append(out)
        dec = self.decode[d.decode_node]
        if d.path == "local":
            for done in dec.advance(self.now):
                self._finished(done)
            dec.prefill_locally(out, self.now)
            self._schedule_decode(dec)
            self._dirty(dec.name)
            for plan in self.core.take_migrations():
                self._migrate(plan)
            return
        dec.inflight += 1
        job = Job(out, dec)
        target = self.prefill[d.prefill_node]
        if d.fetch is not None:
            self.fetches += 1
            self._copy(d.fetch.source, d.fetch.target, req, d.fetch.num_tokens, job)
        else:
            target.enqueue(job)
            self._dirty(target.name)
            self._kick(target)
        for plan in self.core.take_migrations():
            self._migrate(plan)

    def _kick(self, node: SimPrefillNode) -> None:
        started = node.start_next(self.now)
        if started is not None:
            job, end = started
            self._at(end, PREFILL_DONE, node)

    def _prefill_done(self, node: SimPrefillNode) -> None:
        job = node.finish(self.now)
        out = job.out
        self.core.observe_prefill(job.n_new, out.cached, self.now - out.prefill_start, node.name)
        arrive = node.nic.send(self.now, self._transfer_s(node.name, job.decode.name, out.req.input_len),
                               out.req.input_len * self.profile.kv_bytes_per_token)
        self._at(arrive, KV_LANDED, job)
        self._dirty(node.name)
        self._kick(node)

    def _kv_landed(self, job: Job) -> None:
        out = job.out
        out.first_token = self.now
        dec = job.decode
        for done in dec.advance(self.now):
            self._finished(done)
        dec.arrive(out, self.now)
        if out.req.output_len <= 1:
            self._finished(out)
        self._schedule_decode(dec)
        self._dirty(dec.name)

    def _decode_tick(self, payload) -> None:
        dec, version = payload
        if version != dec.version:
            return
        for done in dec.advance(self.now):
            self._finished(done)
        self._schedule_decode(dec)
        self._dirty(dec.name)

    def _schedule_decode(self, dec: SimDecodeNode) -> None:
        dec.version += 1
        t = dec.next_completion()
        if t is not None:
            self._at(max(t, self.now), DECODE_TICK, (dec, dec.version))

    def _finished(self, out: Outcome) -> None:
        self._unfinished -= 1
        self.core.report_delivered(out.req.request_id, out.cached)
        out.req.drop_tokens()

    def _report(self, name: str) -> None:
        self._report_due.discard(name)
        node = self.nodes[name]
        if name in self.duty:
            r = self._flex_report(name)
        elif isinstance(node, SimPrefillNode):
            if node.events:
                self.core.report_kv_events(KVEventBatch(name, tuple(node.events)))
                node.events.clear()
            cache_blocks = node.cache.capacity
            r = LoadReport(name, Role.PREFILL, queued_prefill_tokens=node.queued_tokens, waiting=len(node.queue),
                           running=1 if node.current else 0, free_blocks=cache_blocks - len(node.cache),
                           total_blocks=cache_blocks, cached_blocks=len(node.cache),
                           step_time_s=node.step_ewma, prefill_tokens_per_s=node.speed_ewma, timestamp=self.now)
        else:
            for done in node.advance(self.now):   # what ends before its next tick counts now
                self._finished(done)
            bs = self.block_size
            r = LoadReport(name, Role.DECODE, queued_prefill_tokens=node.queued_prefill_tokens,
                           waiting=len(node.waiting) + node.inflight + len(node.local),
                           running=len(node.running), free_blocks=int(node.free_tokens // bs),
                           total_blocks=int(self.profile.decode_kv_tokens // bs), cached_blocks=0,
                           inflight=node.inflight, step_time_s=node.step_s, timestamp=self.now)
        self.core.report_load(r)

    # -- flex nodes ---------------------------------------------------------------------------
    def _flex_report(self, name: str) -> LoadReport:
        """One report for both halves, as FlexNode sends it (its duty and the order it took)."""
        p, d = self.prefill[name], self.decode[name]
        for done in d.advance(self.now):
            self._finished(done)
        self._settle(name)
        if p.events:
            self.core.report_kv_events(KVEventBatch(name, tuple(p.events)))
            p.events.clear()
        bs = self.block_size
        return LoadReport(name, Role.FLEX, queued_prefill_tokens=p.queued_tokens + d.queued_prefill_tokens,
                          waiting=len(p.queue) + len(d.waiting) + d.inflight + len(d.local),
                          running=len(d.running) + (1 if p.current else 0), free_blocks=int(d.free_tokens // bs),
                          total_blocks=int(self.profile.decode_kv_tokens // bs), cached_blocks=len(p.cache),
                          inflight=d.inflight, step_time_s=d.step_s,   # decode steps only: a prefill's
                          # duration is no step time, and the planner reads this as TPOT
                          prefill_tokens_per_s=p.speed_ewma, timestamp=self.now,
                          duty=self.duty[name].value, duty_order=self.duty_order[name])

    def _settle(self, name: str) -> None:
        """End a drain once the old half holds nothing (flex_node/duty_switch.py: DutySwitch._settle)."""
        old = self.duty[name].draining
        if old is None:
            return
        p, d = self.prefill[name], self.decode[name]
        empty = (not p.queue and p.current is None) if old is Duty.PREFILL else \
            (not d.running and not d.waiting and not d.local and d.inflight == 0)
        if empty:
            self.duty[name] = self.duty[name].target
            if self.duty[name] is Duty.DECODE:   # its memory now holds sequences, not prefixes
                p.cache.clear()
            self._dirty(name)

    def _order_duties(self) -> None:
        """The planner's order, carried to the node at once (FlexNode.set_duty); drains checked."""
        order = self.core.plan_duties()
        if order is not None:
            self.duty[order.node] = self.duty[order.node].toward(order.duty)
            self.duty_order[order.node] = self.core.registry.get(order.node).duty_ordered_at
            self._dirty(order.node)
        for name in self.duty:
            self._settle(name)

    # -- copies -------------------------------------------------------------------------------
    def _copy(self, source: str, target: str, req_tokens, num_tokens: int, job: Job | None) -> None:
        """Copy the leading blocks of a prefix from source to target (what the source still holds
        when asked), through the source's NIC; then `job` (a fetch's request) joins the target."""
        src = self.prefill[source]   # fetches and migrations copy from prefill nodes' caches
        if isinstance(req_tokens, SimRequest):
            hashes = req_tokens.block_hashes(self.block_size)
            tokens = req_tokens.token_ids()
        else:
            hashes, tokens = req_tokens
        n_blocks = min(num_tokens // self.block_size, len(hashes))
        have = src.cache.match(hashes[:n_blocks])
        ntok = have * self.block_size
        self.copy_bytes += ntok * self.profile.kv_bytes_per_token
        done = src.nic.send(self.now, self._transfer_s(source, target, ntok), ntok * self.profile.kv_bytes_per_token)
        self._at(done, COPY_DONE, (target, hashes[:have], tokens[:ntok], job))
        if job is not None:
            job.out.fetched = ntok

    def _copy_done(self, payload) -> None:
        target, hashes, tokens, job = payload
        node = self.prefill[target]
        if hashes:
            node.hold_prefix(list(hashes), tokens)
        if job is not None:
            node.enqueue(job)
            self._kick(node)
        self._dirty(target)

    def _migrate(self, plan: MigrationPlan) -> None:
        from raypd.protocol.block_hash import chained_block_hashes

        tokens = list(plan.token_ids)
        hashes = chained_block_hashes(tokens, self.block_size)
        self._copy(plan.source, plan.target, (hashes, tokens), plan.num_tokens, None)

    # -- periodic -----------------------------------------------------------------------------
    def _sample(self, _) -> None:
        prefilling = [p for name, p in self.prefill.items() if self.duty.get(name, Duty.PREFILL) is Duty.PREFILL]
        q = np.fromiter((p.queued_tokens for p in prefilling), dtype=float, count=len(prefilling))
        m = q.mean() if len(q) else 0.0
        if m > 0:
            self.imbalance.append(float(q.max() / m))
        if self._pending_arrivals > 0:
            self._at(self.now + self.sample_interval_s, SAMPLE)

    def _tick(self, _) -> None:
        res = self.core.tick()
        del res
        if self.duty:
            self._order_duties()
        for plan in self.core.take_migrations():
            self._migrate(plan)
        if self._unfinished > 0:
            self._at(self.now + self.tick_interval_s, TICK)


def _interleave(p: int, d: int) -> list[int]:
    """Indices into [prefill..., decode...] spreading the smaller pool evenly among the larger."""
    order, i, j = [], 0, 0
    total = p + d
    for _ in range(total):
        if j >= d or (i < p and i * d <= j * p):
            order.append(i)
            i += 1
        else:
            order.append(p + j)
            j += 1
    return order
