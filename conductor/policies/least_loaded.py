"""least_loaded: the prefill node with the fewest queued prefill tokens, the decode node holding
the fewest sequences; caches and distance ignored (the load-balancing baseline)."""
from __future__ import annotations

import numpy as np

from raypd.conductor.decision import RouteDecision
from raypd.conductor.policies.base import (
    RoutingPolicy,
    RoutingView,
    least_loaded_decode,
    register_policy,
    require,
    simple_decision,
)


@register_policy
class LeastLoaded(RoutingPolicy):
    name = "least_loaded"

    def route(self, view: RoutingView) -> RouteDecision:
        ps = require(view.prefill_slots, "prefill")
        _, _, queue_s = view.queue_s(ps)
        p = int(ps[int(np.argmin(queue_s))])
        d, tbt, shown = least_loaded_decode(view)
        return simple_decision(view, self.name, "least_loaded", p, d, tbt, shown)
