"""The routing policy contract, the registry by name, and the pieces every policy shares.

A policy sees a RoutingView (the request's prefix match and the per-slot load arrays, topology
matrices and time models) and returns a RouteDecision naming one prefill and one decode node. It
must not mutate the view; the core records the decision, the routed-since-report load and the
metrics. A policy may keep its own state (round robin's cursor) but nothing per request.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from raypd.conductor.config import ConductorConfig
from raypd.conductor.decision import CandidateEstimate, DecodeEstimate, RouteDecision
from raypd.conductor.errors import NoCandidateError, UnknownPolicyError
from raypd.conductor.estimates import DecodeStepModel, PrefillTimeModel
from raypd.conductor.load_table import LoadTable
from raypd.conductor.lower_tiers import LOWER_TIERS, NUM_TIERS
from raypd.conductor.prefix_index import PrefixMatch
from raypd.conductor.topology import Topology
from raypd.protocol.kv_events import KVTier
from raypd.protocol.sampling_params import DEFAULT_PRIORITY

DECODE_SHOWN = 4   # decode candidates recorded in a decision


@dataclass(slots=True)
class RoutingView:
    request_id: str
    num_tokens: int
    match: PrefixMatch
    now: float
    table: LoadTable
    topology: Topology
    prefill_model: PrefillTimeModel
    decode_model: DecodeStepModel
    config: ConductorConfig
    names: list[str]            # node name by slot
    # What nodes hold by their KV events, when `match` also counts blocks routed to a node and not
    # yet reported (core.py, pending_prefixes.py): only held blocks can be fetched from a node.
    held: PrefixMatch | None = None
    # Slots the caller will not use for this request (a retry's failed node, a node held out by
    # the caller's circuit breaker): no policy sees them as candidates.
    excluded: np.ndarray | None = None
    # The request's priority (lower is more urgent): a node serves its queued work at this priority
    # or a more urgent one before it, and the rest after it, so only the former is its queue.
    priority: int = DEFAULT_PRIORITY

    @property
    def fetchable(self) -> PrefixMatch:
        return self.held if self.held is not None else self.match

    @property
    def prefill_slots(self) -> np.ndarray:
        return self._usable(self.table.prefill_slots())

    @property
    def decode_slots(self) -> np.ndarray:
        return self._usable(self.table.decode_slots())

    def _usable(self, slots: np.ndarray) -> np.ndarray:
        if self.excluded is None or not len(self.excluded):
            return slots
        return slots[~np.isin(slots, self.excluded)]

    def cached(self, slots: np.ndarray) -> np.ndarray:
        return self.match.tokens_by_slot[slots] if len(self.match.tokens_by_slot) > slots.max(initial=0) \
            else np.zeros(len(slots), dtype=np.int64)

    def tier_load_s(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tokens per tier (NUM_TIERS x len(slots)), seconds) of each slot's run past its pool run
        (PrefixMatch.tier_tokens) and of loading it into the node's pool: tokens x the node's KV
        bytes per token over the tier's load rate, as measured by the node or else the config's
        default. Zeros with CostConfig.use_tiers off."""
        cfg = self.config.cost
        if self.match.tier_tokens is None or not cfg.use_tiers:
            return np.zeros((NUM_TIERS, len(slots)), dtype=np.int64), np.zeros(len(slots))
        below = self.match.below(slots)
        t = self.table
        kvb = t.kv_bytes_per_token[slots]
        kvb = np.where(kvb > 0, kvb, cfg.kv_bytes_per_token)
        seconds = np.zeros(len(slots))
        for tier in LOWER_TIERS:
            rate = t.tier_load_rate[tier, slots]
            seconds += below[tier] * kvb / np.where(rate > 0, rate, cfg.default_load_bytes_per_s(tier))
        return below, seconds

    def queued_ahead(self, slots: np.ndarray) -> np.ndarray:
        """Prompt tokens queued at each slot (reported + routed since) that this request waits
        behind: those at its priority or a more urgent one (LoadTable.prefill_queue_ahead)."""
        return self.table.prefill_queue_ahead(slots, self.priority)

    def queue_s(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(queued tokens ahead of this request, speed, seconds of queue) per prefill slot."""
        speed = self.prefill_model.speeds(self.table.speed[slots])
        queued = self.queued_ahead(slots)
        return queued, speed, queued / speed

    def send_s(self, src_slot: int, dst_slots: np.ndarray, num_tokens: float | np.ndarray) -> np.ndarray:
        """KV transfer seconds of `num_tokens` (scalar or per destination) from one node to each of
        `dst_slots`; 0 to itself."""
        return self.send_matrix(np.array([src_slot]), dst_slots, num_tokens)[0]

    def send_matrix(self, src_slots: np.ndarray, dst_slots: np.ndarray,
                    num_tokens: float | np.ndarray) -> np.ndarray:
        """(len(src), len(dst)) seconds to send `num_tokens` (scalar or per destination) of KV from
        each source to each destination: bytes over the bottleneck bandwidth plus latency; 0 from
        a node to itself."""
        h = self.table.host
        src = h[src_slots][:, None]
        dst = h[dst_slots][None, :]
        topo = self.topology
        s = (num_tokens * self.config.cost.kv_bytes_per_token) * topo.seconds_per_byte[src, dst] \
            + topo.latency[src, dst] * 1e-6
        return np.where(src_slots[:, None] == dst_slots[None, :], 0.0, s)


class RoutingPolicy(ABC):
    """Choose a (prefill, decode) pair for one request. Subclasses set `name` and implement route."""
    name: ClassVar[str]

    def __init__(self, config: ConductorConfig):
        self.config = config

    @abstractmethod
    def route(self, view: RoutingView) -> RouteDecision:
        ...


POLICIES: dict[str, type[RoutingPolicy]] = {}


def register_policy(cls: type[RoutingPolicy]) -> type[RoutingPolicy]:
    POLICIES[cls.name] = cls
    return cls


def make_policy(name: str, config: ConductorConfig) -> RoutingPolicy:
    try:
        return POLICIES[name](config)
    except KeyError:
        raise UnknownPolicyError(f"unknown routing policy {name!r}; known: {sorted(POLICIES)}") from None


# -- shared pieces ---------------------------------------------------------------------------
@dataclass(slots=True)
class BranchA:
    """Each prefill candidate served from its own KV (Mooncake's Branch A), per slot of `slots`:

        pool only:  TTFT = queue + prefill(n - c | c)
        with tiers: TTFT = queue + load(t) + prefill(n - c - t | c + t)

    c is the node's pool run, t the run past it in the node's tiers (host, disk); a candidate takes
    the tiers when loading them beats computing them (use_tier)."""
    cached: np.ndarray          # pool run
    tiers: np.ndarray           # (NUM_TIERS, k) tokens past the pool run, by the fastest tier holding them
    tier_tokens: np.ndarray     # their sum
    tier_load_s: np.ndarray     # seconds to load them into the pool
    use_tier: np.ndarray        # bool: loading beats computing
    hit: np.ndarray             # tokens the node need not compute: c, or c + t with use_tier
    queued: np.ndarray
    speed: np.ndarray
    queue_s: np.ndarray
    ttft: np.ndarray

    @classmethod
    def of(cls, view: RoutingView, slots: np.ndarray) -> BranchA:
        n, model = view.num_tokens, view.prefill_model
        cached = view.cached(slots)
        queued, speed, queue_s = view.queue_s(slots)
        ttft = queue_s + model.estimate(n - cached, cached, speed)
        if view.match.tier_tokens is None or not view.config.cost.use_tiers:   # pool only
            k = len(slots)
            return cls(cached, np.zeros((NUM_TIERS, k), dtype=np.int64), np.zeros(k, dtype=np.int64),
                       np.zeros(k), np.zeros(k, dtype=bool), cached, queued, speed, queue_s, ttft)
        tiers, load_s = view.tier_load_s(slots)
        tier_tokens = tiers.sum(axis=0)
        deep = cached + tier_tokens
        ttft_t = queue_s + load_s + model.estimate(n - deep, deep, speed)
        use_tier = (tier_tokens > 0) & (ttft_t < ttft)
        return cls(cached, tiers, tier_tokens, load_s, use_tier, np.where(use_tier, deep, cached),
                   queued, speed, queue_s, np.where(use_tier, ttft_t, ttft))

    def candidate(self, view: RoutingView, i: int, slot: int, send_s: float, ttft_s: float,
                  decode_node: str, hit: int | None = None) -> CandidateEstimate:
        """Candidate i (in slot `slot`) as its CandidateEstimate, paired with `decode_node`; `hit`:
        the prefix it will hold when another branch (a fetch) brings more than its own KV."""
        hit = int(self.hit[i]) if hit is None else hit
        total = float(view.table.prefill_queue_tokens(np.array([slot]))[0])
        c = CandidateEstimate(
            view.names[slot], int(self.cached[i]), float(self.queued[i]), float(self.queue_s[i]),
            float(view.prefill_model.estimate(view.num_tokens - hit, hit, float(self.speed[i]))),
            send_s=send_s, ttft_s=ttft_s, decode_node=decode_node,
            queued_behind_tokens=max(0.0, total - float(self.queued[i])))
        if self.tier_tokens[i]:
            c.tier_tokens, c.tier_load_s = int(self.tier_tokens[i]), float(self.tier_load_s[i])
            c.tier_used = bool(self.use_tier[i])
            c.tiers = {KVTier(t).name.lower(): int(k) for t, k in enumerate(self.tiers[:, i].tolist()) if k}
        return c


def require(slots: np.ndarray, what: str) -> np.ndarray:
    if len(slots) == 0:
        raise NoCandidateError(f"no live {what} node")
    return slots


def decode_with_room(view: RoutingView) -> np.ndarray:
    """Decode candidates with KV room for the prompt; all of them if none has room (the decode
    node's prealloc queue then holds the request until blocks free up)."""
    d = require(view.decode_slots, "decode")
    ok = d[view.table.decode_room_tokens(d) >= view.num_tokens]
    return ok if len(ok) else d


@dataclass(slots=True)
class DecodeField:
    """The decode candidates with their load and TBT estimate, computed once per request and then
    paired with any number of prefill candidates (only the KV send time depends on the pair)."""
    slots: np.ndarray
    load: np.ndarray
    tbt: np.ndarray

    @classmethod
    def of(cls, view: RoutingView) -> DecodeField:
        d = decode_with_room(view)
        load = view.table.decode_load(d)
        return cls(d, load, view.decode_model.step_time(load + 1))

    def pick(self, view: RoutingView, prefill_slot: int, by_distance: bool = True
             ) -> tuple[int, float, list[DecodeEstimate]]:
        """Decode node by load and distance from the prefill node: minimise KV send time plus
        decode_weight x estimated time per token with this request added. (slot, TBT, shown)."""
        d, load, tbt = self.slots, self.load, self.tbt
        send = view.send_s(prefill_slot, d, view.num_tokens) if by_distance else np.zeros(len(d))
        score = send + view.config.cost.decode_weight * tbt
        if len(d) > DECODE_SHOWN:
            order = np.argpartition(score, DECODE_SHOWN - 1)[:DECODE_SHOWN]
            order = order[np.argsort(score[order], kind="stable")]
        else:
            order = np.argsort(score, kind="stable")
        shown = [DecodeEstimate(view.names[d[i]], float(load[i]), float(tbt[i]), float(send[i]), float(score[i]))
                 for i in order]
        i = int(np.argmin(score))   # the first of equals, as the cost policy's batched pairing picks
        return int(d[i]), float(tbt[i]), shown


def pick_decode(view: RoutingView, prefill_slot: int, by_distance: bool = True
                ) -> tuple[int, float, list[DecodeEstimate]]:
    return DecodeField.of(view).pick(view, prefill_slot, by_distance)


def least_loaded_decode(view: RoutingView) -> tuple[int, float, list[DecodeEstimate]]:
    d = decode_with_room(view)
    load = view.table.decode_load(d)
    i = int(np.argmin(load))
    tbt = float(view.decode_model.step_time(load[i] + 1))
    return int(d[i]), tbt, [DecodeEstimate(view.names[d[i]], float(load[i]), tbt, 0.0, float(load[i]))]


def simple_decision(view: RoutingView, policy: str, branch: str, p: int, d: int, tbt: float,
                    decode_shown: list[DecodeEstimate]) -> RouteDecision:
    """A decision for policies that do not estimate TTFT themselves: fill in the estimate anyway,
    so every policy's decisions are comparable (and SLO admission applies to all)."""
    a = BranchA.of(view, np.array([p]))
    send = float(view.send_s(p, np.array([d]), view.num_tokens)[0])
    cand = a.candidate(view, 0, p, send, float(a.ttft[0]) + send, view.names[d])
    return RouteDecision(
        request_id=view.request_id, policy=policy, branch=branch, prefill_node=view.names[p],
        decode_node=view.names[d], prompt_tokens=view.num_tokens, predicted_cached_tokens=int(a.hit[0]),
        local_cached_tokens=int(a.cached[0]), est_ttft_s=cand.ttft_s, est_tbt_s=tbt,
        best_match_tokens=view.match.best_tokens,
        best_match_nodes=[view.names[s] for s in view.match.best_slots[:8]],
        num_prefill_candidates=len(view.prefill_slots), num_decode_candidates=len(view.decode_slots),
        candidates=[cand], decode_candidates=decode_shown)
