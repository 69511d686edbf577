"""FailedNodes: the nodes one request's attempts failed on, and when each may serve it again.

A retry or a replay routes around the nodes its earlier attempts failed on (serve/generation.py).
That exclusion is of the incarnation that failed, and it fails open, so that a cluster with one node
of a role (the default `raypd serve`: one prefill, one decode) answers later instead of 503:

    excluded ─the membership shows a new incarnation (Ray restarted it)─> usable: a new node
    excluded ─still LIVE, same incarnation, `fail_open_after_s` after the failure─> usable as a last
              resort (it failed this request for a reason of its own - a lost message, a timeout -
              and answers its probes; retry_limit and migration_limit bound how often)

The grace keeps a node that has just died, which the membership still shows LIVE until the pool's
next probe (about a second), from taking the retry at once.

    for_routing()   the names to exclude, from most to least strict: (every failed incarnation)
                    then (only those not yet failed open); the caller tries each in turn
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from raypd.cluster.client.membership import MemberState
from raypd.cluster.client.node_set import NodeSet


@dataclass(frozen=True, slots=True)
class Failure:
    incarnation: int   # the node's incarnation in the membership when the attempt failed
    at: float          # clock time of the failure


class FailedNodes:
    def __init__(self, nodes: NodeSet, fail_open_after_s: float = 3.0,
                 clock: Callable[[], float] = time.monotonic):
        self.nodes = nodes
        self.fail_open_after_s = fail_open_after_s
        self.clock = clock
        self._failures: dict[str, Failure] = {}

    def add(self, name: str) -> None:
        self._failures[name] = Failure(self._incarnation(name), self.clock())

    def __bool__(self) -> bool:
        return bool(self._failures)

    def excluded(self) -> frozenset[str]:
        """Every failed node whose failed incarnation is still the current one."""
        return frozenset(name for name, f in self._failures.items() if self._incarnation(name) == f.incarnation)

    def failed_open(self) -> frozenset[str]:
        """The excluded nodes that are LIVE and failed at least fail_open_after_s ago: usable when
        nothing else is."""
        now = self.clock()
        membership = self.nodes.membership
        return frozenset(name for name in self.excluded()
                         if now - self._failures[name].at >= self.fail_open_after_s
                         and (m := membership.by_name.get(name)) is not None and m.state is MemberState.LIVE)

    def for_routing(self) -> list[frozenset[str]]:
        """The exclusions to route with, most strict first, without repeats."""
        strict = self.excluded()
        lenient = strict - self.failed_open()
        return [strict] if lenient == strict else [strict, lenient]

    def _incarnation(self, name: str) -> int:
        member = self.nodes.membership.by_name.get(name)
        return member.incarnation if member is not None else -1
