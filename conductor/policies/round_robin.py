"""round_robin: the baseline that ignores caches and load; and Rotation, the one turn-taking rule
(this policy's, and the cluster's RoundRobinRouter when no Conductor runs)."""
from __future__ import annotations

import numpy as np

from raypd.conductor.decision import RouteDecision
from raypd.conductor.policies.base import (
    RoutingPolicy,
    RoutingView,
    decode_with_room,
    register_policy,
    require,
    simple_decision,
)


class Rotation:
    """Takes turns over a pool whose size may change between calls (nodes join and die): the i-th
    call returns position i mod the pool's size at that call."""

    def __init__(self) -> None:
        self._calls = 0

    def next_index(self, size: int) -> int:
        i = self._calls % size
        self._calls += 1
        return i


@register_policy
class RoundRobin(RoutingPolicy):
    name = "round_robin"

    def __init__(self, config):
        super().__init__(config)
        self._prefill = Rotation()
        self._decode = Rotation()

    def route(self, view: RoutingView) -> RouteDecision:
        ps = require(view.prefill_slots, "prefill")
        ds = decode_with_room(view)
        p = int(ps[self._prefill.next_index(len(ps))])
        d = int(ds[self._decode.next_index(len(ds))])
        tbt = float(view.decode_model.step_time(view.table.decode_load(np.array([d]))[0] + 1))
        return simple_decision(view, self.name, "rotate", p, d, tbt, [])
