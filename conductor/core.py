"""ConductorCore: the Conductor without Ray. Composes the registry, the prefix index, the topology,
the load table, the time models, the routing policy, the split-or-local choice, the migration
planner, the flex nodes' duty planner, the decision log and the metrics; the Ray actor (actor.py)
and the simulator (sim/) both drive this class, so what the simulator measures is the code that
serves.

A flex node is routed to as its duty: the load table's prefill/decode bits follow the duty ordered
(order_duty, at once: nothing new reaches a node that is to drain) and then the duty its load
reports carry (the drain's end), except reports stamped before the last order.

Node death (explicit, or a missed heartbeat found by check_heartbeats) drops the node from every
part at once: registry slot, index entries, load arrays, running migrations.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from raypd.conductor.config import ConductorConfig
from raypd.conductor.decision import DecisionLog, RouteDecision
from raypd.conductor.errors import (
    AdmissionRejected,
    DutyOrderRefused,
    NoCandidateError,
    RetireRefused,
    UnknownNodeError,
)
from raypd.conductor.estimates import DecodeStepModel, PrefillTimeModel
from raypd.conductor.load_table import LoadTable
from raypd.conductor.lower_tiers import LOWER_TIERS
from raypd.conductor.metrics import ConductorMetrics
from raypd.conductor.pending_prefixes import PendingPrefixes
from raypd.conductor.planners.duties import DutyOrder, DutyPlanner, DutySignals, FlexState
from raypd.conductor.planners.migration import MigrationPlan, MigrationPlanner
from raypd.conductor.policies import RoutingPolicy, RoutingView, make_policy
from raypd.conductor.prefix_index import ApplyResult, PrefixIndex, PrefixMatch, bits
from raypd.conductor.registry import NodeInfo, NodeRegistry
from raypd.conductor.split_or_local import choose_path, local_decision
from raypd.conductor.topology import Topology
from raypd.protocol.duty import Duty
from raypd.protocol.kv_events import BlockStored
from raypd.protocol.messages import HostInfo, KVEventBatch, LoadReport
from raypd.protocol.queued_by_priority import LEAST_URGENT
from raypd.protocol.roles import Role
from raypd.protocol.sampling_params import DEFAULT_PRIORITY, check_priority

_PREDICTIONS_KEPT = 4096

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _NodeStats:
    routed: int = 0
    prompt_tokens: int = 0
    predicted_cached: int = 0
    delivered_reports: int = 0
    delivered_prompt_tokens: int = 0
    delivered_cached: int = 0
    migrations_in: int = 0
    migrations_out: int = 0


@dataclass(slots=True)
class TickResult:
    dead: list[str] = field(default_factory=list)
    expired_migrations: list[MigrationPlan] = field(default_factory=list)
    landed_migrations: list[MigrationPlan] = field(default_factory=list)


class ConductorCore:
    def __init__(self, config: ConductorConfig | None = None, topology: Topology | None = None,
                 clock: Callable[[], float] = time.time, metrics: ConductorMetrics | None = None,
                 policy: RoutingPolicy | None = None):
        self.config = config = config if config is not None else ConductorConfig()
        self.clock = clock
        self.registry = NodeRegistry(config.heartbeat_timeout_s, clock)
        self.index = PrefixIndex(verify_hashes=config.verify_hashes, default_block_size=config.block_size)
        self.pending = PendingPrefixes()
        self.topology = topology if topology is not None else Topology()
        self.table = LoadTable()
        c = config.cost
        self.prefill_model = PrefillTimeModel(c.default_prefill_tokens_per_s, c.attention_coeff, c.prefill_overhead_s)
        self.decode_model = DecodeStepModel(c.decode_step_base_s, c.decode_step_per_seq_s)
        self.policy = policy if policy is not None else make_policy(config.policy, config)
        self.planner = MigrationPlanner(config.migration, c.kv_bytes_per_token)
        self.duties = DutyPlanner(config.duties)
        self._ordered_duties: dict[str, Duty] = {}   # the duty last ordered per flex node, kept across its restarts
        self.log = DecisionLog(config.decision_log_size)
        self.metrics = metrics if metrics is not None else ConductorMetrics()
        self._names: list[str] = []
        self._stats: dict[str, _NodeStats] = {}
        self._predicted: OrderedDict[str, tuple[str, int, int]] = OrderedDict()
        self.num_decisions = 0
        self.num_local = 0       # decisions on the local path (a decode node prefills the prompt)
        self.num_rejected = 0

    # -- membership ---------------------------------------------------------------------------
    def register_node(self, name: str, role: Role | str, host: HostInfo, handle: Any = None,
                      bootstrap_address: str = "", duty: Duty | str = "") -> NodeInfo:
        """`duty`: a flex node's current duty (it keeps it across a Conductor restart)."""
        if name in self.registry:
            self.mark_dead(name, "re-registered (restart)")
        info = self.registry.register(name, role, host, handle, bootstrap_address, duty)
        host_idx = self.topology.ensure_host(self.host_key(host))
        routed = info.routed_as
        self.table.add(info.slot, prefill=routed is not None and routed.serves_prefill,
                       decode=routed is not None and routed.serves_decode, host=host_idx,
                       block_size=self.config.block_size)
        self.index.add_node(name, info.slot)
        while len(self._names) <= info.slot:
            self._names.append("")
        self._names[info.slot] = name
        self._stats.setdefault(name, _NodeStats())
        return info

    def host_key(self, host: HostInfo) -> str:
        """The topology's name for a node's machine: its Ray node id, else hostname, else ip
        (whichever the topology was built with); an unknown machine joins under its node id."""
        for key in (host.node_id, host.hostname, host.ip):
            if key and self.topology.has_host(key):
                return key
        return host.node_id or host.hostname or host.ip

    def mark_dead(self, name: str, reason: str = "marked dead") -> bool:
        info = self.registry.mark_dead(name, reason)
        if info is None:
            return False
        self._forget(info)
        return True

    def retire_node(self, name: str, retiring: bool = True) -> None:
        """The node pool drains `name` to remove it (retiring=True): from now on nothing new is routed
        to it, nor does the duty planner move it, while its requests finish and its load still
        counts; retiring=False calls the drain off. RetireRefused when it would leave no node to
        decode (or, without local prefill, none to prefill): the pool keeps it then."""
        info = self.registry.get_alive(name)
        if retiring and not info.retiring and (routed := info.routed_as) is not None:
            def others(slots: np.ndarray) -> int:
                return len(slots[slots != info.slot])

            def refused(duty: str) -> RetireRefused:
                # Others that could take the duty but are draining themselves: said, or an operator
                # seeing several live nodes cannot tell why this one is "the last".
                draining = sorted(o.name for o in self.registry.alive() if o.retiring and o.name != name)
                why = f" (others draining: {', '.join(draining)})" if draining else ""
                return RetireRefused(f"{name} is the last node to {duty}{why}: it cannot be drained away")
            if routed.serves_decode and not others(self.table.decode_slots()):
                raise refused("decode")
            if routed.serves_prefill and not others(self.table.prefill_slots()) and not self.config.local_prefill.enabled:
                raise refused("prefill")
        info.retiring = retiring
        routed = info.routed_as
        self.table.set_roles(info.slot, prefill=routed is not None and routed.serves_prefill,
                             decode=routed is not None and routed.serves_decode)

    def _forget(self, info: NodeInfo) -> None:
        """A dead node leaves every part at once: index entries, load arrays, its name by slot (a
        restart may register it on another slot), its migrations."""
        self.index.remove_node(info.name)
        self._names[info.slot] = ""
        self.pending.remove_slot(info.slot)
        self.table.remove(info.slot)
        for _ in self.planner.drop_node(info.name, self.clock()):
            self.metrics.migration("failed")

    def heartbeat(self, name: str) -> None:
        self.registry.heartbeat(name)

    def report_load(self, report: LoadReport) -> None:
        info = self.registry.report_load(report)
        self.table.update(info.slot, report)
        if info.duty is not None and report.duty and report.duty_order >= info.duty_ordered_at:
            reported = Duty.parse(report.duty)
            if reported is not info.duty:   # a change only: each report would otherwise rebuild the slot sets
                self._set_duty(info, reported)
        routed = info.routed_as
        if routed is not None and routed.serves_decode and report.running > 0 and report.step_time_s > 0:
            self.decode_model.observe(report.running, report.step_time_s)
        if report.timestamp > 0:
            self.metrics.report_lag(self.clock() - report.timestamp)
        self.metrics.node_load(info.name, info.role, report.queued_prefill_tokens, report.running, report.free_blocks)

    def report_kv_events(self, batch: KVEventBatch) -> ApplyResult:
        info = self.registry.get_alive(batch.node_name)
        result = self.index.apply(batch.node_name, batch.events)
        self.table.block_size[info.slot] = self.index.node_block_size(batch.node_name)
        self.metrics.events(result.applied)
        if self.planner.active:
            for plan in self.planner.landed(self._holds, self.clock()):
                self._migration_ended(plan)
        return result

    def resync(self, name: str, last_seq: int, events: Sequence[BlockStored]) -> None:
        self.registry.get_alive(name)
        self.index.resync(name, last_seq, events)
        self.metrics.resync(name)

    def nodes_needing_resync(self) -> list[NodeInfo]:
        return [self.registry.get(n) for n in self.index.nodes_needing_resync()]

    # -- routing ------------------------------------------------------------------------------
    def route(self, request_id: str, prompt_token_ids: Sequence[int], now: float | None = None,
              block_hashes: dict[int, list[int]] | None = None, exclude: Collection[str] = (),
              priority: int = DEFAULT_PRIORITY) -> RouteDecision:
        """Choose (prefill, decode) for one request. Raises AdmissionRejected when an SLO is set
        and the best estimate breaks it, NoCandidateError when no node can serve, InvalidRequestError
        for a priority that is not one.

        `block_hashes` lets a caller that already hashed the prompt (an ingress replica, off the
        Conductor's one thread) skip hashing here: {block size: PrefixIndex.hash_prompt(...)[bs]}
        computed with engine.block_hash; hashing is about half of a decision's time. `priority`: the
        request's (SamplingParams.priority); every estimate counts only the queued work a node serves
        before it (RoutingView.priority), the SLO admission included."""
        check_priority(priority)
        t0 = time.perf_counter()
        now = self.clock() if now is None else now
        if block_hashes is not None and set(block_hashes) != set(self.index.block_sizes()):
            block_hashes = None   # hashed for other block sizes than the nodes use: redo it here
        indexed = self.index.match(prompt_token_ids, self.registry.num_slots, block_hashes)
        match = self._with_pending(indexed, now)
        excluded = np.array(sorted(self.registry.get(n).slot for n in exclude if n in self.registry), dtype=np.int64)
        view = RoutingView(request_id, len(prompt_token_ids), match, now, self.table, self.topology,
                           self.prefill_model, self.decode_model, self.config, self._names, held=indexed,
                           excluded=excluded, priority=priority)
        cfg = self.config
        d = self._decide(view)
        d.decided_at, d.priority = now, priority
        reason, est, slo = "", 0.0, 0.0
        if cfg.ttft_slo_s is not None and d.est_ttft_s > cfg.ttft_slo_s:
            reason, est, slo = "ttft", d.est_ttft_s, cfg.ttft_slo_s
        elif cfg.tbt_slo_s is not None and d.est_tbt_s > cfg.tbt_slo_s:
            reason, est, slo = "tbt", d.est_tbt_s, cfg.tbt_slo_s
        if reason:
            d.rejected = reason
            d.latency_s = time.perf_counter() - t0
            self.log.append(d)
            self.num_rejected += 1
            self.metrics.rejection(reason)
            raise AdmissionRejected(request_id, reason, est, slo, d)

        p = self.registry.get_alive(d.prefill_node)
        dn = self.registry.get_alive(d.decode_node)
        self.table.add_pending_prefill(p.slot, d.prompt_tokens - d.predicted_cached_tokens, now, priority)
        self.table.add_pending_decode(dn.slot, d.prompt_tokens, now)
        if cfg.pending_prefixes:
            bs = self.index.node_block_size(p.name) or cfg.block_size
            chain = match.hashes.get(bs) or next(iter(match.hashes.values()), [])
            # Only what the node does not hold yet: a cache hit adds just the new question's blocks.
            known = indexed.tokens(p.slot) // bs
            self.pending.add(p.slot, chain, now + max(cfg.pending_ttl_factor * d.est_ttft_s, 1.0), start=known)
        if cfg.migration.enabled:
            # Migration copies what nodes hold, so it reasons on the index alone, and for the prefix's
            # requests of every priority: a holder's whole queue (a request at the least urgent's).
            d.migration = self._consider_migration(replace(view, match=indexed, priority=LEAST_URGENT),
                                                   prompt_token_ids, now)
        d.latency_s = time.perf_counter() - t0
        self._record(d)
        return d

    def _decide(self, view: RoutingView) -> RouteDecision:
        """The policy's split decision, then, when local prefill is on, split or local
        (split_or_local.py); with no live prefill node the local path is the only one."""
        lp = self.config.local_prefill
        try:
            split: RouteDecision | None = self.policy.route(view)
        except NoCandidateError:
            if not lp.enabled or not len(view.decode_slots):
                raise
            split = None
        if split is not None and not lp.enabled:
            return split
        est = choose_path(view, split, lp, self.config.tbt_slo_s)
        if est is None:
            if split is None:
                raise NoCandidateError("no live prefill node, and no decode node has KV room for the prompt")
            return split
        if est.chosen or split is None:   # no prefill node: local even past a TBT SLO (admission judges it)
            return local_decision(view, est, split, self.policy.name)
        split.local = est
        return split

    def _with_pending(self, indexed: PrefixMatch, now: float) -> PrefixMatch:
        """The index's match, raised on each node to the blocks routed there and not yet reported
        (a node's tier run then starts where its raised pool run ends)."""
        if not self.config.pending_prefixes:
            return indexed
        self.pending.expire(now)
        if not len(self.pending):
            return indexed
        tokens = indexed.tokens_by_slot.copy()
        for bs, chain in indexed.hashes.items():
            ahead = self.pending.tokens_by_slot(chain, bs, len(tokens), self.index.holder_masks)
            np.maximum(tokens, ahead[:len(tokens)], out=tokens)
        tiers = indexed.tier_tokens
        if tiers is not None:
            raised = np.flatnonzero((tokens > indexed.tokens_by_slot) & tiers.any(axis=0))
            if len(raised):
                tiers = tiers.copy()
                for slot in raised.tolist():
                    tiers[:, slot] = self.index.tier_run(slot, indexed.hashes, int(tokens[slot]))
        return PrefixMatch.of(indexed.num_tokens, indexed.hashes, tokens, tiers)

    def _consider_migration(self, view: RoutingView, token_ids: Sequence[int], now: float) -> MigrationPlan | None:
        deep = view.match.deepest_hash()
        if deep is None:
            return None
        held = np.array(bits(self.index.holders_mask(deep[1])), dtype=np.int64)
        holders = held[self.table.alive[held] & self.table.prefill_role[held]] if len(held) else held
        return self.planner.observe(view, token_ids, holders, now)

    def _record(self, d: RouteDecision) -> None:
        self.num_decisions += 1
        self.log.append(d)
        st = self._stats[d.prefill_node]
        st.routed += 1
        st.prompt_tokens += d.prompt_tokens
        st.predicted_cached += d.predicted_cached_tokens
        self._predicted[d.request_id] = (d.prefill_node, d.predicted_cached_tokens, d.prompt_tokens)
        if len(self._predicted) > _PREDICTIONS_KEPT:
            self._predicted.popitem(last=False)
        self.num_local += d.path == "local"
        self.metrics.decision(d.policy, d.branch, d.latency_s, d.predicted_cached_tokens, d.path)

    def report_delivered(self, request_id: str, cached_tokens: int) -> int | None:
        """The cached tokens the prefill node actually used for a routed request (PrefillResult /
        TokenChunk.num_cached_tokens). Returns delivered - predicted, or None if unknown."""
        entry = self._predicted.pop(request_id, None)
        if entry is None:
            return None
        node, predicted, prompt = entry
        st = self._stats.get(node)
        if st is not None:
            st.delivered_reports += 1
            st.delivered_prompt_tokens += prompt
            st.delivered_cached += cached_tokens
        self.metrics.delivered(predicted, cached_tokens)
        return cached_tokens - predicted

    def observe_prefill(self, n_new: int, n_cached: int, seconds: float, node: str) -> None:
        """A measured prefill time, to refit the prefill model's attention term."""
        info = self.registry.get_alive(node)
        speed = float(self.prefill_model.speeds(self.table.speed[[info.slot]])[0])
        self.prefill_model.observe(n_new, n_cached, seconds, speed)

    # -- migrations ---------------------------------------------------------------------------
    def take_migrations(self) -> list[MigrationPlan]:
        plans = self.planner.take_planned()
        for p in plans:
            self.metrics.migration("started", p.nbytes)
        return plans

    def finish_migration(self, plan_id: int, ok: bool, error: str = "") -> MigrationPlan | None:
        plan = self.planner.finish(plan_id, ok, self.clock(), error)
        if plan is not None:
            self._migration_ended(plan)
        return plan

    def _migration_ended(self, plan: MigrationPlan) -> None:
        self.metrics.migration("finished" if not plan.error else "failed")
        if not plan.error:
            for name, attr in ((plan.source, "migrations_out"), (plan.target, "migrations_in")):
                if name in self._stats:
                    setattr(self._stats[name], attr, getattr(self._stats[name], attr) + 1)

    def _holds(self, node: str, key: int) -> bool:
        try:
            slot = self.registry.get_alive(node).slot
        except UnknownNodeError:
            return False
        return bool((self.index.holders_mask(key) >> slot) & 1)

    # -- housekeeping -------------------------------------------------------------------------
    def tick(self) -> TickResult:
        """Periodic work: expire silent nodes, time out migrations, note landed copies."""
        now = self.clock()
        res = TickResult()
        for info in self.registry.expire():
            self._forget(info)
            res.dead.append(info.name)
        res.expired_migrations = self.planner.expire(now)
        for _ in res.expired_migrations:
            self.metrics.migration("failed")
        res.landed_migrations = self.planner.landed(self._holds, now)
        for plan in res.landed_migrations:
            self._migration_ended(plan)
        self.metrics.index(self.index.num_blocks, self.index.num_entries)
        return res

    # -- flex nodes' duties (planners/duties.py) ------------------------------------------------------
    def plan_duties(self) -> DutyOrder | None:
        """The planner's order for now, already applied here (the caller tells the node)."""
        if not any(info.duty is not None for info in self.registry.alive()):
            return None
        order = self.duties.plan(self.clock(), self.duty_signals())
        if order is not None:
            try:
                self.order_duty(order.node, order.duty)
            except DutyOrderRefused as e:   # the planner's view and the invariant disagree: no order
                log.info("duty planner's order refused: %s", e)
                return None
        return order

    def order_duty(self, name: str, duty: Duty | str) -> Duty:
        """Route `name` as `duty` once it drained the other: from now on it gets no work of the other
        duty (nor any while it drains). Returns the state expected; the node's reports confirm it,
        once they carry this order's stamp (`NodeInfo.duty_ordered_at`, which the caller hands the
        node with the order). DutyOrderRefused for a node that is not flex, or when the order would
        leave no node to decode (or, without local prefill, none to prefill). Either the planner's or
        an operator's: both start the planner's cooldown."""
        info = self.registry.get_alive(name)
        if info.duty is None:
            raise DutyOrderRefused(f"{name} is a {info.role} node: only flex nodes change duty")
        if info.retiring:
            raise DutyOrderRefused(f"{name} is being drained to leave the pool")
        target = Duty.parse(duty).target
        leaving = info.routed_as
        if leaving is not None and leaving is not target.role:
            others = self.table.decode_slots() if leaving is Role.DECODE else self.table.prefill_slots()
            if not len(others[others != info.slot]) and (leaving is Role.DECODE or not self.config.local_prefill.enabled):
                raise DutyOrderRefused(f"{name} is the last node in the {leaving} duty: ordering it to {target} "
                                 f"would leave no node to {'decode' if leaving is Role.DECODE else 'prefill'}")
        now = self.clock()
        self._set_duty(info, info.duty.toward(target))
        info.duty_ordered_at = max(now, info.duty_ordered_at + 1e-6)   # a fresh stamp, even on a coarse clock
        self._ordered_duties[name] = target
        self.duties.ordered(now, name, target)
        self.metrics.duty_order(target)
        return info.duty

    def duty_order_lost(self, name: str, stamp: float) -> None:
        """The node could not be told of the order stamped `stamp` (dead, timed out): believe its
        own reports again rather than wait for a stamp it will never echo."""
        info = self.registry.get(name) if name in self.registry else None
        if info is not None and info.alive and info.duty_ordered_at == stamp:
            info.duty_ordered_at = 0.0
            self._ordered_duties.pop(name, None)

    def duty_to_restore(self, name: str) -> Duty | None:
        """After a flex node re-registered (Ray restarted it with the duty it was launched with), the
        duty last ordered for it, if that differs and may still be taken; the caller orders it again."""
        info = self.registry.get(name) if name in self.registry else None
        wanted = self._ordered_duties.get(name)
        if info is None or info.duty is None or wanted is None or info.duty.target is wanted:
            return None
        try:
            self.order_duty(name, wanted)
        except DutyOrderRefused as e:
            log.info("not restoring %s's %s duty: %s", name, wanted, e)
            self._ordered_duties.pop(name, None)
            return None
        return wanted

    def _set_duty(self, info: NodeInfo, duty: Duty) -> None:
        info.duty = duty
        routed = info.routed_as
        self.table.set_roles(info.slot, prefill=routed is Role.PREFILL, decode=routed is Role.DECODE)

    def duty_signals(self) -> DutySignals:
        """What the duty planner reads: see planners/duties.py's docstring."""
        t = self.table
        p, d = t.prefill_slots(), t.decode_slots()
        alive = np.flatnonzero(t.alive[:self.registry.num_slots])
        queued_s = np.zeros(t.capacity)
        queued_s[alive] = t.prefill_queue_tokens(alive) / self.prefill_model.speeds(t.speed[alive])
        sequences = np.zeros(t.capacity)
        sequences[alive] = t.decode_load(alive)
        prompt_side = p if len(p) else d
        flex = tuple(FlexState(info.name, info.duty, float(queued_s[info.slot]), float(sequences[info.slot]))
                     for info in self.registry.alive() if info.duty is not None and not info.retiring)
        steps = t.step_time[d][(t.step_time[d] > 0) & (t.running[d] > 0)]   # decoding now: a step is a TPOT
        known = d[t.total_blocks[d] > 0]           # reported at least once
        used = 1.0 - t.free_blocks[known] / t.total_blocks[known]
        return DutySignals(prompt_wait_s=float(queued_s[prompt_side].mean()) if len(prompt_side) else 0.0,
                           decode_sequences=float(sequences[d].sum()), prefill_nodes=len(p), decode_nodes=len(d),
                           decode_kv_used=float(used.mean()) if len(known) else 0.0,
                           decode_kv_used_max=float(used.max()) if len(known) else 0.0,
                           decode_step_s=float(steps.mean()) if len(steps) else 0.0,
                           decode_step_base_s=float(self.decode_model.base_s), flex=flex)

    def recent_decisions(self, n: int = 20) -> list[RouteDecision]:
        return self.log.recent(n)

    def status(self) -> dict:
        nodes = {}
        for info in self.registry.all():
            st = self._stats.get(info.name, _NodeStats())
            r = info.load
            nodes[info.name] = {
                "role": info.role.value, "duty": info.duty.value if info.duty is not None else None,
                "alive": info.alive, "death_reason": info.death_reason, "retiring": info.retiring,
                "host": info.host.hostname or info.host.node_id, "node_id": info.host.node_id,
                "queued_prefill_tokens": r.queued_prefill_tokens if r else 0,
                "queued_prefill_by_priority": [list(level) for level in r.queued_prefill_by_priority] if r else [],
                "waiting": r.waiting if r else 0, "running": r.running if r else 0,
                "free_blocks": r.free_blocks if r else 0, "total_blocks": r.total_blocks if r else 0,
                "cached_blocks": r.cached_blocks if r else 0,
                "indexed_blocks": self.index.node_blocks(info.name) if info.name in self.index else 0,
                "indexed_tier_blocks": {t.name.lower(): self.index.node_blocks(info.name, t) for t in LOWER_TIERS}
                                       if info.name in self.index else {},
                "needs_resync": info.name in self.index and self.index.needs_resync(info.name),
                "routed": st.routed,
                "predicted_hit_rate": st.predicted_cached / st.prompt_tokens if st.prompt_tokens else 0.0,
                "delivered_hit_rate": (st.delivered_cached / st.delivered_prompt_tokens
                                       if st.delivered_prompt_tokens else None),
                "migrations_in": st.migrations_in, "migrations_out": st.migrations_out,
            }
        pl = self.planner
        return {
            "policy": self.policy.name, "decisions": self.num_decisions, "rejected": self.num_rejected,
            "local_decisions": self.num_local,
            "index_blocks": self.index.num_blocks, "index_entries": self.index.num_entries,
            "index_tier_entries": self.index.num_tier_entries,
            "resyncs": self.index.num_resyncs, "dropped_events": self.index.num_dropped_events,
            "migrations": {"started": pl.started, "finished": pl.finished, "failed": pl.failed,
                           "active": len(pl.active), "bytes_started": pl.bytes_started, "skips": dict(pl.skips)},
            "duty_orders": [o.to_dict() for o in self.duties.orders[-16:]],
            "nodes": nodes,
        }
