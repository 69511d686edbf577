"""CircuitBreaker: a node that keeps failing requests leaves this caller's routing for a while.

Per node, within one ingress replica (each replica judges what it sees):

    CLOSED ─`failures` failures within `window_s`─> OPEN ─`cooldown_s` passed─> HALF_OPEN
    HALF_OPEN ─a request on it succeeds─> CLOSED
    HALF_OPEN ─a request on it fails─> OPEN (a new cool-down)
    any ─the node restarted (a new incarnation: node_set.py tells)─> CLOSED

Only OPEN nodes are excluded from routing (Router.route's `exclude`); a HALF_OPEN node takes
traffic again and the first outcome decides. It is fail-open: the caller routes without the
breaker's exclusions when they would leave a role with no node (serve/generation.py), so the
breaker alone never makes a request fail. Node deaths are the membership's business; the breaker is
for nodes that answer their probes but fail requests. The clock is injected for the tests.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum


class BreakerState(IntEnum):
    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


@dataclass(slots=True)
class _Node:
    state: BreakerState = BreakerState.CLOSED
    failures: deque = field(default_factory=deque)   # times of recent failures (CLOSED)
    opened_at: float = 0.0


class CircuitBreaker:
    def __init__(self, failures: int = 3, window_s: float = 30.0, cooldown_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.threshold = failures
        self.window_s = window_s
        self.cooldown_s = cooldown_s
        self.clock = clock
        self._nodes: dict[str, _Node] = {}
        self.num_opened = 0

    def failure(self, name: str) -> None:
        now = self.clock()
        node = self._nodes.setdefault(name, _Node())
        self._advance(node, now)
        if node.state is BreakerState.HALF_OPEN:
            self._open(node, now)
            return
        if node.state is BreakerState.OPEN:
            return
        node.failures.append(now)
        while node.failures and node.failures[0] < now - self.window_s:
            node.failures.popleft()
        if len(node.failures) >= self.threshold:
            self._open(node, now)

    def success(self, name: str) -> None:
        node = self._nodes.get(name)
        if node is None:
            return
        self._advance(node, self.clock())
        if node.state is BreakerState.HALF_OPEN:
            del self._nodes[name]

    def forget(self, name: str) -> None:
        """The node restarted: its past failures say nothing about the new incarnation."""
        self._nodes.pop(name, None)

    def excluded(self) -> frozenset[str]:
        """The OPEN nodes: routing skips them until their cool-down has passed."""
        now = self.clock()
        out = []
        for name, node in self._nodes.items():
            self._advance(node, now)
            if node.state is BreakerState.OPEN:
                out.append(name)
        return frozenset(out)

    def state(self, name: str) -> BreakerState:
        node = self._nodes.get(name)
        if node is None:
            return BreakerState.CLOSED
        self._advance(node, self.clock())
        return node.state

    def _advance(self, node: _Node, now: float) -> None:
        if node.state is BreakerState.OPEN and now - node.opened_at >= self.cooldown_s:
            node.state = BreakerState.HALF_OPEN

    def _open(self, node: _Node, now: float) -> None:
        node.state = BreakerState.OPEN
        node.opened_at = now
        node.failures.clear()
        self.num_opened += 1
