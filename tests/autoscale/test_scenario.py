"""A load history played through the policy the way the node pool drives it: the ingress's counts
into an SloWindow, the window read since the pool last changed, orders carried out by a toy pool
(a node takes 30 s to start and 10 s to drain), done() at their end. 1x load, then 3x, then 1x again:
the pool grows while it misses its SLO and gives a node back once it idles."""
from __future__ import annotations

from raypd.cluster.autoscale.config import AutoscaleConfig, RoleRange
from raypd.cluster.autoscale.policy import RoleLoad, ScaleOrder, ScalePolicy, ScaleSignals
from raypd.cluster.autoscale.slo_counts import SloCounts, SloWindow
from raypd.protocol.roles import Role

CONFIG = AutoscaleConfig(ranges=(RoleRange(Role.MIXED, 1, 4),), ttft_target_s=1.0, tpot_target_s=0.1)
NODE_RATE = 10.0            # requests per second one node serves
START_S, DRAIN_S = 30.0, 10.0


def rate(t: float) -> float:
    return 18.0 if 100 <= t < 400 else 6.0


class ToyPool:
    """Mixed nodes that serve NODE_RATE each: at 90% busy or more requests queue and half of them
    miss their TTFT; below, 95% meet it (TPOT always does)."""

    def __init__(self) -> None:
        self.live, self.starting, self.draining = 1, 0, 0
        self.pending: list[tuple[float, ScaleOrder]] = []      # (when it ends, the order)

    def carry_out(self, order: ScaleOrder, at: float) -> None:
        if order.delta > 0:
            self.starting += 1
            self.pending.append((at + START_S, order))
        else:
            self.live, self.draining = self.live - 1, self.draining + 1
            self.pending.append((at + DRAIN_S, order))

    def ended(self, at: float) -> list[ScaleOrder]:
        out = [order for end, order in self.pending if end <= at]
        self.pending = [(end, order) for end, order in self.pending if end > at]
        for order in out:
            if order.delta > 0:
                self.starting, self.live = self.starting - 1, self.live + 1
            else:
                self.draining -= 1
        return out

    def measure(self, at: float) -> tuple[SloCounts, RoleLoad]:
        """The last tick's requests and the nodes' load."""
        busy = min(1.0, rate(at) / (self.live * NODE_RATE))
        n = round(rate(at) * CONFIG.tick_s)
        met = round(n * (0.5 if busy >= 0.9 else 0.95))
        waiting = 3.0 * self.live if busy >= 0.9 else 0.0
        return (SloCounts(met, n, n, n, 0),
                RoleLoad(Role.MIXED, self.live, self.starting, self.draining, busy, waiting, kv_used=busy / 2))


def test_a_load_that_triples_then_falls_back_adds_two_nodes_then_removes_one():
    policy, pool, window = ScalePolicy(CONFIG), ToyPool(), SloWindow(CONFIG.window_s)
    orders, sizes = [], {}
    for i in range(351):
        at = i * CONFIG.tick_s
        for order in pool.ended(at):
            policy.done(order, at)
        counts, load = pool.measure(at)
        window.add(at, counts)
        signals = ScaleSignals(at, window.over(at, since=policy.changed_at), {Role.MIXED: load})
        if (order := policy.decide(signals)) is not None:
            orders.append(order)
            pool.carry_out(order, at)
        sizes[at] = pool.live
    assert [(o.delta, o.at) for o in orders] == [(+1, 106.0), (+1, 156.0), (-1, 460.0)]
    # the first: half the requests late since 100 (95% met before), and a queue
    assert orders[0].reason == ("TTFT attainment 70% < 90% over 276 requests; 3.0 requests waiting per mixed node "
                                "> 2, for 6.0s")
    # the second: the pool changed at 136, so only the 10 ticks of the two-node pool count (its hold ran
    # since 108, the up cooldown kept it to 156)
    assert orders[1].reason == ("TTFT attainment 50% < 90% over 360 requests; 3.0 requests waiting per mixed node "
                                "> 2, for 48.0s")
    assert orders[2].reason == ("busy 20% -> 30% with one node fewer (< 50%), KV 10% -> 15%, 0.0 waiting per node, "
                                "for 60.0s")
    assert (sizes[98.0], sizes[136.0], sizes[186.0], sizes[460.0], sizes[700.0]) == (1, 2, 3, 2, 2)
    assert policy.changed_at == 470.0 and policy.in_flight == ()
