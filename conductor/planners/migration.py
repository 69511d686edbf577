"""Hot-prefix migration planner: when to copy a hot prefix to a lightly loaded prefill node.

Per routed request, the prefix it matched gets a hit (hot_prefix.py); then, for that prefix only,
the trigger is checked - all of these must hold:

    hot:        decayed score >= hot_score and prefix >= min_prefix_tokens
    overloaded: every prefill node holding it has an estimated queue >= overload_queue_s (measured),
                or the prefix's hit rate x the prefill time of a request's uncached part, spread
                over its holders, exceeds max_holder_utilization (predicted: replicate before the
                queues build, not after)
    light:      some prefill node without it has a queue <= light_queue_s and room for it
    worth it:   saving over the next window > margin x transfer cost, where
                saving = (expected hits in window / (holders + 1))
                         x min(holder queue - target queue, prefill time of the prefix on the target)
                (a request either waits at a holder or recomputes the prefix elsewhere; the copy
                spares it the cheaper of the two) and cost = the topology's transfer time
    bounded:    fewer than max_concurrent migrations in flight, none for this prefix or to this
                target, and the prefix is out of its cooldown

Plan lifecycle:  PLANNED -> RUNNING -> DONE | FAILED
  PLANNED  returned by observe(); the driver (actor or simulator) takes it with take_planned()
  RUNNING  the holder copies the blocks node to node (kvtransfer); the Conductor never sees bytes
  DONE     the target's KV events show it holds the prefix (landed()), or the driver reports success
  FAILED   the driver reports an error, or timeout_s passes; the prefix enters its cooldown
A failed copy leaves both nodes consistent by the node-side contract (the target frees what it
reserved, the source unlocks its blocks); the index never assumed the copy.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from raypd.conductor.config import MigrationConfig
from raypd.conductor.planners.hot_prefix import HotPrefix, HotPrefixTracker


class MigrationStatus(IntEnum):
    PLANNED = 0
    RUNNING = 1
    DONE = 2
    FAILED = 3


@dataclass(slots=True)
class MigrationPlan:
    plan_id: int
    prefix_key: int
    block_size: int
    num_tokens: int
    token_ids: tuple[int, ...] = field(repr=False)
    source: str
    target: str
    est_cost_s: float
    est_saving_s: float
    nbytes: int
    created_at: float
    status: MigrationStatus = MigrationStatus.PLANNED
    finished_at: float = 0.0
    error: str = ""


class MigrationPlanner:
    def __init__(self, config: MigrationConfig, kv_bytes_per_token: int):
        self.config = config
        self.kv_bytes_per_token = kv_bytes_per_token
        self.hot = HotPrefixTracker(config.half_life_s, config.max_tracked)
        self._ids = itertools.count(1)
        self.active: dict[int, MigrationPlan] = {}
        self._by_key: dict[int, int] = {}
        self._targets: set[str] = set()
        self._cooldown: dict[int, float] = {}
        self._planned: list[MigrationPlan] = []
        self.history: list[MigrationPlan] = []      # finished plans, most recent last (bounded)
        self.started = self.finished = self.failed = 0
        self.bytes_started = 0
        # why hot prefixes were not migrated, for status() and tuning
        self.skips = {"bounded": 0, "holders_keep_up": 0, "no_light_target": 0, "not_worth_it": 0}

    # -- trigger ------------------------------------------------------------------------------
    def observe(self, view, token_ids, holders: np.ndarray, now: float) -> MigrationPlan | None:
        """Count a hit on the request's best-matched prefix and check the trigger for it.
        `holders` are the prefill slots holding that prefix (from the index)."""
        deep = view.match.deepest_hash()
        if deep is None or view.match.best_tokens < self.config.min_prefix_tokens:
            return None
        bs, key = deep
        e = self.hot.hit(key, bs, view.match.best_tokens, token_ids, now)
        return self.evaluate(e, view, holders, now)

    def evaluate(self, e: HotPrefix, view, holders: np.ndarray, now: float) -> MigrationPlan | None:
        cfg = self.config
        if self.hot.score(e, now) < cfg.hot_score or len(holders) == 0:
            return None
        if len(self.active) >= cfg.max_concurrent or e.key in self._by_key or self._cooldown.get(e.key, -1.0) > now:
            self.skips["bounded"] += 1
            return None
        ps = view.prefill_slots
        _, speed, queue_s = view.queue_s(ps)
        is_holder = np.isin(ps, holders)
        if not is_holder.any():
            return None
        holder_q = float(queue_s[is_holder].min())
        hslots = ps[is_holder]
        rate = self.hot.rate(e, now)
        service = float(view.prefill_model.estimate(max(view.num_tokens - e.num_tokens, 1), e.num_tokens,
                                                    float(np.median(speed[is_holder]))))
        utilization = rate * service / len(hslots)
        if holder_q < cfg.overload_queue_s and utilization < cfg.max_holder_utilization:
            self.skips["holders_keep_up"] += 1
            return None
        t = view.table
        room = np.where(t.total_blocks[ps] > 0, t.free_blocks[ps] * t.block_size[ps], np.inf)
        busy_target = np.array([view.names[s] in self._targets for s in ps], dtype=bool)
        light = ~is_holder & (queue_s <= cfg.light_queue_s) & (room >= e.num_tokens) & ~busy_target
        if not light.any():
            self.skips["no_light_target"] += 1
            return None
        # Target: lightest after paying for the copy; source: the holder it is fastest to copy from.
        cand = np.flatnonzero(light)
        copy_s = np.min([view.send_s(int(h), ps[cand], e.num_tokens) for h in hslots[:8]], axis=0)
        j = int(np.argmin(queue_s[cand] + copy_s))
        ti = int(cand[j])
        target = int(ps[ti])
        source = int(hslots[int(np.argmin(view.send_s(target, hslots, e.num_tokens)))])
        cost = float(copy_s[j])
        recompute = float(view.prefill_model.estimate(e.num_tokens, 0, speed[ti]))
        # a request either waits at a holder (at least its queue, at least one service time when
        # holders run hot) or recomputes the prefix elsewhere; the copy spares the cheaper of the two
        wait = max(holder_q, service * utilization) - float(queue_s[ti])
        per_request = max(min(wait, recompute), 0.0)
        expected = rate * cfg.window_s / (len(hslots) + 1)
        saving = expected * per_request
        if saving <= cfg.margin * cost:
            self.skips["not_worth_it"] += 1
            return None
        plan = MigrationPlan(
            plan_id=next(self._ids), prefix_key=e.key, block_size=e.block_size, num_tokens=e.num_tokens,
            token_ids=e.token_ids, source=view.names[source], target=view.names[target],
            est_cost_s=cost, est_saving_s=saving, nbytes=e.num_tokens * self.kv_bytes_per_token,
            created_at=now)
        self.active[plan.plan_id] = plan
        self._by_key[plan.prefix_key] = plan.plan_id
        self._targets.add(plan.target)
        self._planned.append(plan)
        return plan

    # -- lifecycle ----------------------------------------------------------------------------
    def take_planned(self) -> list[MigrationPlan]:
        plans, self._planned = self._planned, []
        for p in plans:
            p.status = MigrationStatus.RUNNING
            self.started += 1
            self.bytes_started += p.nbytes
        return plans

    def finish(self, plan_id: int, ok: bool, now: float, error: str = "") -> MigrationPlan | None:
        plan = self.active.get(plan_id)
        if plan is None:
            return None   # already landed or timed out
        return self._end(plan, ok, now, error)

    def _end(self, plan: MigrationPlan, ok: bool, now: float, error: str = "") -> MigrationPlan:
        del self.active[plan.plan_id]
        plan.status = MigrationStatus.DONE if ok else MigrationStatus.FAILED
        plan.finished_at, plan.error = now, error
        if ok:
            self.finished += 1
        else:
            self.failed += 1
        self._by_key.pop(plan.prefix_key, None)
        self._targets.discard(plan.target)
        self._cooldown[plan.prefix_key] = now + self.config.cooldown_s
        if plan in self._planned:
            self._planned.remove(plan)
        self.history.append(plan)
        del self.history[:-256]
        return plan

    def landed(self, holds, now: float) -> list[MigrationPlan]:
        """Finish running plans whose target now holds the prefix; `holds(node, key) -> bool`."""
        done = [p for p in self.active.values()
                if p.status is MigrationStatus.RUNNING and holds(p.target, p.prefix_key)]
        return [self._end(p, True, now) for p in done]

    def expire(self, now: float) -> list[MigrationPlan]:
        late = [p for p in self.active.values() if now - p.created_at > self.config.timeout_s]
        return [self._end(p, False, now, "timed out") for p in late]

    def drop_node(self, name: str, now: float) -> list[MigrationPlan]:
        """Fail the plans a dead node takes part in."""
        hit = [p for p in self.active.values() if name in (p.source, p.target)]
        return [self._end(p, False, now, f"node {name} died") for p in hit]
