"""ScalePolicy on hand-built signal histories, fed tick by tick (every 2 s) with the time passed in:
which role a shortfall points to, when an order comes (after its hold, outside its cooldown, one at
a time), what repairs at once, and when an idle role gives a node back."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from raypd.cluster.autoscale.config import AutoscaleConfig, RoleRange
from raypd.cluster.autoscale.policy import RoleLoad, ScaleOrder, ScalePolicy, ScaleSignals
from raypd.cluster.autoscale.slo_counts import SloCounts
from raypd.protocol.roles import Role

P, D, M = Role.PREFILL, Role.DECODE, Role.MIXED
PD = AutoscaleConfig(ranges=(RoleRange(P, 1, 4), RoleRange(D, 1, 4)), ttft_target_s=1.0, tpot_target_s=0.1)
MIXED = replace(PD, ranges=(RoleRange(M, 1, 4),))


def slo(ttft: float = 1.0, tpot: float = 1.0, n: int = 40, rejected: int = 0) -> SloCounts:
    """n requests served (plus `rejected` refused), the given shares of them within each target."""
    return SloCounts(round(ttft * n), n, round(tpot * n), n, rejected)


GOOD = slo()
LATE = slo(ttft=0.7)        # TTFT attainment 70% against 90%


def load(role: Role, live: int = 2, busy: float = 0.6, waiting: float = 0.0, kv: float = 0.3, starting: int = 0,
         draining: int = 0) -> RoleLoad:
    return RoleLoad(role, live, starting, draining, busy, waiting, kv)


def tick(policy: ScalePolicy, at: float, counts: SloCounts, *loads: RoleLoad) -> ScaleOrder | None:
    return policy.decide(ScaleSignals(at, counts, {x.role: x for x in loads}))


def run(policy: ScalePolicy, start: float, end: float, counts: SloCounts, *loads: RoleLoad) -> list[ScaleOrder]:
    """The same signals every 2 s from `start` to `end` (both included): the orders given."""
    orders = []
    for i in range(int((end - start) / 2) + 1):
        if (order := tick(policy, start + 2 * i, counts, *loads)) is not None:
            orders.append(order)
    return orders


# -- repair -------------------------------------------------------------------------------------------
def test_a_role_below_its_least_is_repaired_at_once_and_once():
    policy = ScalePolicy(replace(PD, ranges=(RoleRange(P, 1, 4), RoleRange(D, 2, 4))))
    order = tick(policy, 0.0, GOOD, load(P), load(D, live=1))           # a decode node died for good
    assert order == ScaleOrder(D, +1, "1 decode nodes live + 0 starting, fewer than 2", 0.0)
    assert policy.in_flight == (order,)
    assert run(policy, 2.0, 40.0, GOOD, load(P), load(D, live=1, starting=1)) == []
    policy.done(order, 41.0)
    assert run(policy, 42.0, 50.0, GOOD, load(P), load(D, live=2)) == []


def test_a_repair_calls_a_drain_off_and_ignores_holds_cooldowns_and_other_roles_orders():
    policy = ScalePolicy(PD)
    add = run(policy, 0.0, 6.0, LATE, load(P), load(D))
    assert [(o.role, o.kind) for o in add] == [(P, "add")]
    order = tick(policy, 8.0, GOOD, load(P, starting=1), load(D, live=0, draining=1))
    assert order is not None and (order.role, order.kind, order.at) == (D, "cancel-drain", 8.0)


def test_a_failed_repair_is_retried_after_the_up_cooldown():
    policy = ScalePolicy(PD)
    order = tick(policy, 0.0, GOOD, load(P, live=0), load(D))
    assert order is not None and order.kind == "add"
    policy.done(order, 10.0, ok=False)                 # the node never came up
    assert policy.changed_at == float("-inf")          # nothing changed: the SLO counts go on
    assert run(policy, 10.0, 28.0, GOOD, load(P, live=0), load(D)) == []
    assert "a start failed 18.0s ago, retrying after 20s" in policy.notes["prefill"]
    retry = tick(policy, 30.0, GOOD, load(P, live=0), load(D))
    assert retry is not None and (retry.role, retry.kind) == (P, "add")


# -- up: which role, and when -------------------------------------------------------------------------
def test_a_held_ttft_shortfall_adds_a_prefill_node_in_pd_not_before_its_hold():
    policy = ScalePolicy(PD)
    assert run(policy, 0.0, 4.0, LATE, load(P), load(D)) == []
    assert "for 4.0s of 6s" in policy.notes["prefill"]
    order = tick(policy, 6.0, LATE, load(P), load(D))
    assert order == ScaleOrder(P, +1, "TTFT attainment 70% < 90% over 40 requests, for 6.0s", 6.0)


def test_refusals_count_as_ttft_misses():
    policy = ScalePolicy(PD)
    refusing = slo(n=32, rejected=8)                   # every served request on time, 8 of 40 refused
    (order,) = run(policy, 0.0, 6.0, refusing, load(P), load(D))
    assert (order.role, order.reason) == (P, "TTFT attainment 80% < 90% over 40 requests, 8 refused, for 6.0s")


def test_a_shortfall_must_hold_without_a_break():
    policy = ScalePolicy(PD)
    assert run(policy, 0.0, 4.0, LATE, load(P), load(D)) == []
    assert tick(policy, 6.0, GOOD, load(P), load(D)) is None
    assert run(policy, 8.0, 12.0, LATE, load(P), load(D)) == []
    order = tick(policy, 14.0, LATE, load(P), load(D))
    assert order is not None and order.at == 14.0


def test_too_few_requests_leave_attainment_unknown():
    policy = ScalePolicy(PD)
    assert run(policy, 0.0, 20.0, slo(ttft=0.0, tpot=0.0, n=7), load(P), load(D)) == []


def test_with_mixed_nodes_only_either_shortfall_adds_a_mixed_node():
    for counts in (LATE, slo(tpot=0.5)):
        (order,) = run(ScalePolicy(MIXED), 0.0, 6.0, counts, load(M))
        assert order.role is M and order.kind == "add"


def test_a_tpot_shortfall_adds_a_decode_node():
    (order,) = run(ScalePolicy(PD), 0.0, 6.0, slo(tpot=0.5), load(P), load(D))
    assert order == ScaleOrder(D, +1, "TPOT attainment 50% < 90% over 40 requests, for 6.0s", 6.0)


@pytest.mark.parametrize("decode", [load(D, waiting=6.0), load(D, kv=0.95)])
def test_ttft_misses_point_to_decode_when_decode_is_the_one_queueing(decode):
    (order,) = run(ScalePolicy(PD), 0.0, 6.0, LATE, load(P, waiting=1.0), decode)
    assert order.role is D and "TTFT attainment 70% < 90%" in order.reason


def test_ttft_misses_point_to_prefill_when_both_queue_and_prefill_queues_more():
    (order,) = run(ScalePolicy(PD), 0.0, 6.0, LATE, load(P, waiting=16.0), load(D, waiting=6.0))
    assert order.role is P
    assert order.reason == ("8.0 requests waiting per prefill node > 2; TTFT attainment 70% < 90% over 40 "
                            "requests, for 6.0s")


def test_a_queue_alone_is_a_shortfall_of_its_role():
    (order,) = run(ScalePolicy(PD), 0.0, 6.0, SloCounts.ZERO, load(P), load(D, waiting=5.0))
    assert order.reason == "2.5 requests waiting per decode node > 2, for 6.0s"


def test_no_second_addition_within_the_up_cooldown():
    policy = ScalePolicy(PD)
    (first,) = run(policy, 0.0, 6.0, LATE, load(P), load(D))
    assert run(policy, 8.0, 28.0, LATE, load(P, starting=1), load(D)) == []
    assert policy.notes["prefill"].endswith("add in flight")
    policy.done(first, 30.0)
    assert policy.changed_at == 30.0
    assert run(policy, 30.0, 48.0, LATE, load(P, live=3), load(D)) == []
    assert "cooling down: last addition ended 18.0s ago of 20s" in policy.notes["prefill"]
    second = tick(policy, 50.0, LATE, load(P, live=3), load(D))
    assert second is not None and (second.role, second.kind) == (P, "add")


def test_a_failed_addition_waits_the_up_cooldown_before_the_next_try():
    policy = ScalePolicy(PD)
    (first,) = run(policy, 0.0, 6.0, LATE, load(P), load(D))
    policy.done(first, 8.0, ok=False)
    assert policy.changed_at == float("-inf")
    assert run(policy, 8.0, 26.0, LATE, load(P), load(D)) == []
    retry = tick(policy, 28.0, LATE, load(P), load(D))
    assert retry is not None and (retry.role, retry.kind) == (P, "add")


def test_no_addition_while_a_node_of_another_role_starts():
    policy = ScalePolicy(PD)
    assert run(policy, 0.0, 10.0, slo(tpot=0.5), load(P), load(D, starting=1)) == []
    assert policy.notes["decode"].endswith("waits for the node starting")


def test_a_role_at_its_most_does_not_grow_and_says_so():
    policy = ScalePolicy(PD)
    assert run(policy, 0.0, 30.0, LATE, load(P, live=4), load(D)) == []
    assert policy.notes["prefill"] == ("short: TTFT attainment 70% < 90% over 40 requests; at its most (4 nodes): "
                                       "cannot grow")


def test_a_short_role_with_a_node_draining_calls_the_drain_off_instead_of_adding():
    policy = ScalePolicy(PD)
    (removal,) = run(policy, 0.0, 60.0, GOOD, load(P, live=3, busy=0.2), load(D))
    assert (removal.role, removal.delta) == (P, -1)
    draining = load(P, live=2, draining=1)
    orders = run(policy, 62.0, 68.0, LATE, draining, load(D, starting=1))      # a decode node starts too
    assert [(o.role, o.kind, o.at) for o in orders] == [(P, "cancel-drain", 68.0)]
    assert orders[0].reason == "TTFT attainment 70% < 90% over 40 requests, for 6.0s: a drain called off"
    assert policy.in_flight == (orders[0],)             # it replaced the removal
    assert run(policy, 70.0, 80.0, LATE, draining, load(D)) == []      # one order per role
    policy.done(removal, 81.0)                          # the removal's end, reported late: the call-off stays
    assert policy.in_flight == (orders[0],)


def test_a_drain_called_off_restarts_the_counts_and_the_up_cooldown():
    policy = ScalePolicy(PD)
    assert [o.delta for o in run(policy, 0.0, 60.0, GOOD, load(P, live=3, busy=0.2), load(D))] == [-1]
    (call_off,) = run(policy, 62.0, 68.0, LATE, load(P, live=2, draining=1), load(D))
    policy.done(call_off, 70.0)
    assert policy.changed_at == 70.0 and policy.in_flight == ()
    assert run(policy, 70.0, 88.0, LATE, load(P, live=3), load(D)) == []
    order = tick(policy, 90.0, LATE, load(P, live=3), load(D))
    assert order is not None and (order.role, order.kind) == (P, "add")


def test_an_order_that_changed_nothing_leaves_the_counts_alone():
    policy = ScalePolicy(PD)
    (removal,) = run(policy, 0.0, 60.0, GOOD, load(P, live=3, busy=0.2), load(D))
    policy.done(removal, 62.0, ok=False)                # the drain could not begin
    assert policy.changed_at == float("-inf") and policy.in_flight == ()
    orders = run(policy, 64.0, 130.0, GOOD, load(P, live=3, busy=0.2), load(D))
    assert [(o.role, o.delta, o.at) for o in orders] == [(P, -1, 124.0)]    # held again from 64
    policy.done(orders[0], 130.0)
    assert policy.changed_at == 130.0


def test_an_unscaled_role_in_the_signals_is_ignored():
    policy = ScalePolicy(replace(PD, ranges=(RoleRange(P, 1, 4),)))
    assert run(policy, 0.0, 10.0, slo(tpot=0.5), load(P), load(D, waiting=9.0)) == []
    (order,) = run(policy, 12.0, 18.0, LATE, load(P), load(D, waiting=9.0))
    assert order.role is P


# -- down ---------------------------------------------------------------------------------------------
IDLE_D = load(D, live=2, busy=0.2)              # 20% -> 40% with one node fewer


def test_an_idle_role_gives_a_node_back_after_its_hold_not_before():
    policy = ScalePolicy(PD)
    assert run(policy, 0.0, 58.0, GOOD, load(P, busy=0.9), IDLE_D) == []
    assert "for 58.0s of 60s" in policy.notes["decode"]
    order = tick(policy, 60.0, GOOD, load(P, busy=0.9), IDLE_D)
    assert order == ScaleOrder(D, -1, "busy 20% -> 40% with one node fewer (< 50%), KV 30% -> 60%, 0.0 waiting "
                                      "per node, for 60.0s", 60.0)


def test_the_idlest_role_goes_first_and_only_one():
    policy = ScalePolicy(PD)
    orders = run(policy, 0.0, 100.0, SloCounts.ZERO, load(P, busy=0.1), IDLE_D)
    assert [(o.role, o.delta, o.at) for o in orders] == [(P, -1, 60.0)]


def test_never_below_least():
    assert run(ScalePolicy(PD), 0.0, 200.0, GOOD, load(P, live=1, busy=0.0), load(D, live=1, busy=0.0)) == []
    zero = ScalePolicy(replace(PD, ranges=(RoleRange(P, 0, 4), RoleRange(D, 1, 4))))
    orders = run(zero, 0.0, 200.0, GOOD, load(P, live=1, busy=0.0), load(D, live=1, busy=0.0))
    assert [(o.role, o.delta, o.at) for o in orders] == [(P, -1, 60.0)]   # its last node, since it did nothing


@pytest.mark.parametrize("others", [load(P, starting=1), load(P, draining=1)])
def test_not_while_a_node_starts_or_drains(others):
    policy = ScalePolicy(PD)
    assert run(policy, 0.0, 100.0, GOOD, others, IDLE_D) == []
    assert policy.notes["decode"].endswith(f"waits: prefill {'starting' if others.starting else 'draining'}")
    order = tick(policy, 102.0, GOOD, load(P), IDLE_D)
    assert order is not None and (order.role, order.delta) == (D, -1)


@pytest.mark.parametrize("busy, live, removed", [(0.3, 2, False), (0.3, 3, True), (0.2, 2, True)])
def test_not_when_the_busy_share_over_one_node_fewer_is_too_high(busy, live, removed):
    orders = run(ScalePolicy(PD), 0.0, 60.0, GOOD, load(P), load(D, live=live, busy=busy))
    assert [(o.role, o.delta) for o in orders] == ([(D, -1)] if removed else [])


def test_not_a_decode_node_whose_kv_the_others_could_not_hold():
    assert run(ScalePolicy(PD), 0.0, 100.0, GOOD, load(P), load(D, busy=0.2, kv=0.5)) == []


def test_not_with_a_queue_or_an_slo_shortfall_even_one_no_scaled_role_takes():
    queued = load(D, busy=0.2, waiting=1.5)             # 0.75 per node > 2 / 4
    assert run(ScalePolicy(PD), 0.0, 100.0, GOOD, load(P), queued) == []
    prefill_only = ScalePolicy(replace(PD, ranges=(RoleRange(P, 1, 4),)))
    assert run(prefill_only, 0.0, 100.0, slo(tpot=0.5), load(P, busy=0.1)) == []


def test_a_shortfall_anywhere_longer_than_a_burst_restarts_every_down_hold():
    policy = ScalePolicy(PD)
    assert run(policy, 0.0, 50.0, GOOD, load(P), IDLE_D) == []
    assert run(policy, 52.0, 64.0, GOOD, load(P), load(D)) == []                # decode busy for 12 s
    assert run(policy, 66.0, 124.0, GOOD, load(P), IDLE_D) == []
    order = tick(policy, 126.0, GOOD, load(P), IDLE_D)
    assert order is not None and (order.role, order.delta) == (D, -1)


def test_a_burst_shorter_than_down_break_s_leaves_the_down_hold_running_but_no_removal_during_it():
    policy = ScalePolicy(PD)
    assert run(policy, 0.0, 50.0, GOOD, load(P), IDLE_D) == []
    assert run(policy, 52.0, 56.0, GOOD, load(P, waiting=6.0), IDLE_D) == []    # prefill short for 4 s: a burst
    assert tick(policy, 58.0, GOOD, load(P), IDLE_D) is None                     # the hold ran on: 58 s of 60
    order = tick(policy, 60.0, GOOD, load(P), IDLE_D)
    assert order is not None and (order.role, order.delta) == (D, -1) and order.reason.endswith("for 60.0s")


def test_a_removal_waits_the_down_cooldown_after_any_order_ended():
    policy = ScalePolicy(PD)
    (add,) = run(policy, 0.0, 6.0, LATE, load(P), load(D))
    assert run(policy, 8.0, 38.0, GOOD, load(P, busy=0.2, starting=1), load(D, busy=0.9)) == []   # the load fell
    assert policy.notes["prefill"].endswith("for 30.0s of 60s")           # its hold runs meanwhile
    policy.done(add, 40.0)
    assert run(policy, 40.0, 98.0, GOOD, load(P, live=3, busy=0.2), load(D, busy=0.9)) == []    # held since 8
    assert "cooling down: last order 58.0s ago of 60s" in policy.notes["prefill"]
    order = tick(policy, 100.0, GOOD, load(P, live=3, busy=0.2), load(D, busy=0.9))
    assert order is not None and (order.role, order.delta, order.at) == (P, -1, 100.0)


# -- the record ---------------------------------------------------------------------------------------
def test_orders_are_kept_and_reported_json_safe():
    policy = ScalePolicy(PD)
    (order,) = run(policy, 0.0, 6.0, LATE, load(P), load(D))
    assert policy.orders == [order]
    assert order.to_dict() == {"role": "prefill", "delta": 1, "kind": "add", "cancel_drain": False,
                               "reason": "TTFT attainment 70% < 90% over 40 requests, for 6.0s", "at": 6.0}
    status = json.loads(json.dumps(policy.status()))
    assert status["in_flight"] == [order.to_dict()] and status["changed_at"] is None
    assert status["notes"]["slo"] == ("TTFT 70% over 40 requests (0 refused), TPOT 100% over 40; target 90%, "
                                      "judged from 8 requests")
    for i in range(70):                                 # a decode node that dies as soon as it is replaced
        repair = tick(policy, 100.0 + i, GOOD, load(P), load(D, live=0))
        assert repair is not None
        policy.done(repair, 100.0 + i)
    assert len(policy.orders) == 64 and policy.orders[-1].at == 169.0


@pytest.mark.parametrize("delta, cancel", [(0, False), (2, False), (-1, True)])
def test_an_order_moves_one_node(delta, cancel):
    with pytest.raises(ValueError):
        ScaleOrder(P, delta, "", 0.0, cancel_drain=cancel)


# -- early signals: what running requests see now --------------------------------------------------------
def test_steps_past_the_tpot_share_add_a_node_before_any_request_misses():
    busy_m = replace(load(M, live=1, busy=1.0), step_s=0.09, step_base_s=0.04)   # 90 ms > 80% of 100 ms
    policy = ScalePolicy(MIXED)
    assert run(policy, 0.0, 4.0, GOOD, busy_m) == []                               # its hold: 6 s
    order = tick(policy, 6.0, GOOD, busy_m)
    assert order == ScaleOrder(M, 1, "mixed steps 90 ms > 80% of the TPOT target, for 6.0s", 6.0)
    assert run(ScalePolicy(MIXED), 0.0, 60.0, GOOD, replace(busy_m, step_s=0.07)) == []


def test_prompts_waiting_past_the_ttft_share_add_a_prefill_node():
    waiting_p = replace(load(P, live=2), prompt_wait_s=0.9)                        # 0.9 s > 80% of 1 s
    order = run(ScalePolicy(PD), 0.0, 6.0, GOOD, waiting_p, load(D))
    assert [(o.role, o.delta, o.reason) for o in order] == [
        (P, 1, "prompts wait 0.90 s for compute on a prefill node > 80% of the TTFT target, for 6.0s")]


@pytest.mark.parametrize("step_s, live, removed", [
    (0.045, 2, True),     # 40 + (45 - 40) x 2 = 50 ms with one node fewer: under half the 100 ms target
    (0.060, 2, False),    # 40 + 20 x 2 = 80 ms: not
    (0.060, 3, False),    # 40 + 20 x 1.5 = 70 ms: not either
    (0.044, 3, True),     # 40 + 4 x 1.5 = 46 ms
])
def test_a_busy_decoding_role_whose_steps_leave_room_with_one_node_fewer_gives_one_back(step_s, live, removed):
    d = replace(load(D, live=live, busy=1.0, kv=0.1), step_s=step_s, step_base_s=0.04)
    orders = run(ScalePolicy(PD), 0.0, 60.0, GOOD, load(P, busy=0.9), d)
    projected = 0.04 + (step_s - 0.04) * live / (live - 1)
    assert [(o.role, o.delta) for o in orders] == ([(D, -1)] if removed else [])
    if orders:
        assert orders[0].reason.startswith(f"steps {step_s * 1000:.0f} -> {projected * 1000:.0f} ms with one node fewer")


def test_a_mixed_role_keeps_its_node_while_prompts_would_wait_too_long_with_one_fewer():
    m = replace(load(M, live=2, busy=1.0, kv=0.1), step_s=0.041, step_base_s=0.04)
    assert [(o.role, o.delta) for o in run(ScalePolicy(MIXED), 0.0, 60.0, GOOD, m)] == [(M, -1)]
    assert run(ScalePolicy(MIXED), 0.0, 60.0, GOOD, replace(m, prompt_wait_s=0.3)) == []   # 0.6 s > half of 1 s
