"""round_robin: the baseline that ignores caches and load."""
from __future__ import annotations

import numpy as np

from raypd.conductor.decision import RouteDecision
from raypd.conductor.policies.base import RoutingPolicy, RoutingView, decode_with_room, register_policy, require, simple_decision


@register_policy
class RoundRobin(RoutingPolicy):
    name = "round_robin"

    def __init__(self, config):
        super().__init__(config)
        self._p = 0
        self._d = 0

    def route(self, view: RoutingView) -> RouteDecision:
        ps = require(view.prefill_slots, "prefill")
        ds = decode_with_room(view)
        p = int(ps[self._p % len(ps)])
        d = int(ds[self._d % len(ds)])
        self._p += 1
        self._d += 1
        tbt = float(view.decode_model.step_time(view.table.decode_load(np.array([d]))[0] + 1))
        return simple_decision(view, self.name, "rotate", p, d, tbt, [])
