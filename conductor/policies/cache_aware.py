"""cache_aware: the seed's threshold chain (Mooncake Conductor note, section 2).

    best match == 0                      -> least loaded                 (branch "no_prefix")
    best match / prompt < min_hit_ratio  -> least loaded                 (branch "low_hit")
    some holder not overloaded           -> least loaded such holder     (branch "cache_hit")
    every holder overloaded              -> nearest non-overloaded node  (branch "near_cache")
                                            by 0.7 distance + 0.3 load, both normalized

Holders are nodes whose match is within `band` of the best. Overload is judged per request among
the candidates (SGLang's imbalance test): a holder is overloaded when its queue exceeds the lightest
candidate's by both `balance_abs_tokens` and a factor `balance_rel`; never a fleet-wide switch.
"""
from __future__ import annotations

import numpy as np

from raypd.conductor.decision import RouteDecision
from raypd.conductor.policies.base import (
    RoutingPolicy,
    RoutingView,
    pick_decode,
    register_policy,
    require,
    simple_decision,
)


@register_policy
class CacheAware(RoutingPolicy):
    name = "cache_aware"

    def route(self, view: RoutingView) -> RouteDecision:
        cfg = self.config.cache_aware
        ps = require(view.prefill_slots, "prefill")
        cached = view.cached(ps)
        queued, _, queue_s = view.queue_s(ps)
        best = int(cached.max())
        lightest = float(queued.min())
        overloaded = (queued - lightest > cfg.balance_abs_tokens) & (queued > cfg.balance_rel * max(lightest, 1.0))
        if best == 0:
            branch, i = "no_prefix", int(np.argmin(queue_s))
        elif best / max(view.num_tokens, 1) < cfg.min_hit_ratio:
            branch, i = "low_hit", int(np.argmin(queue_s))
        else:
            holders = cached >= cfg.band * best
            ok = holders & ~overloaded
            if ok.any():
                branch = "cache_hit"
                i = int(np.argmin(np.where(ok, queue_s, np.inf)))
            else:
                branch = "near_cache"
                i = self._near(view, ps, holders, overloaded, queued)
        p = int(ps[i])
        d, tbt, shown = pick_decode(view, p)
        return simple_decision(view, self.name, branch, p, d, tbt, shown)

    def _near(self, view: RoutingView, ps: np.ndarray, holders: np.ndarray, overloaded: np.ndarray,
              queued: np.ndarray) -> int:
        cfg = self.config.cache_aware
        pool = ~overloaded
        if not pool.any():
            pool = np.ones(len(ps), dtype=bool)
        h = view.table.host
        lat = view.topology.latency[np.ix_(h[ps], h[ps[holders]])].mean(axis=1)
        lat = np.where(np.isfinite(lat), lat, np.nanmax(np.where(np.isfinite(lat), lat, 0)) * 2 + 1)
        dist = lat / max(float(lat.max()), 1e-9)
        load = queued / max(float(queued.max()), 1.0)
        score = cfg.distance_weight * dist + cfg.load_weight * load
        return int(np.argmin(np.where(pool, score, np.inf)))
