"""Flex nodes' duties in the Conductor (conductor/planners/duties.py, ConductorCore.order_duty /
plan_duties), on hand-built states: the real core with load reports written by the test and a fake
clock. A flex node is routed to as its duty; an order takes it out of its old duty's routing at
once; its reports that echo the order's stamp (not older ones) say when the drain ended; the planner moves a node only after a
pressure held, one change at a time, never below the minimum of either duty."""
from __future__ import annotations

from dataclasses import replace

import pytest

from raypd.conductor.config import ConductorConfig, DutyPlannerConfig, LocalPrefillConfig
from raypd.conductor.core import ConductorCore
from raypd.conductor.errors import DutyOrderRefused, NoCandidateError
from raypd.conductor.planners.duties import DutyPlanner, DutySignals, FlexState
from raypd.protocol.duty import Duty
from tests.conductor.helpers import host, load

BS = 16
PROMPT = list(range(1000, 1064))
LOCAL = LocalPrefillConfig(enabled=True)
SPLIT_ONLY = LocalPrefillConfig()
PLANNER = DutyPlannerConfig(busy_wait_s=2.0, hold_s=4.0, cooldown_s=8.0)


def make(duties: DutyPlannerConfig = PLANNER, local: LocalPrefillConfig = SPLIT_ONLY) -> ConductorCore:
    core = ConductorCore(ConductorConfig(block_size=BS, duties=duties, local_prefill=local),
                         clock=_Clock())
    core.register_node("f0", "flex", host(), duty="prefill")
    core.register_node("f1", "flex", host(), duty="decode")
    core.register_node("f2", "flex", host(), duty="decode")
    for name, duty in (("f0", "prefill"), ("f1", "decode"), ("f2", "decode")):
        report(core, name, duty)
    return core


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def report(core: ConductorCore, name: str, duty: str, queued: int = 0, running: int = 0, order: float | None = None,
           free_blocks: int = 1000, step_time_s: float = 0.0):
    """A LoadReport from flex node `name`; `order`: the order stamp it echoes (default: the last
    order's, as a node that took it does)."""
    stamp = core.registry.get(name).duty_ordered_at if order is None else order
    core.report_load(replace(load(name, "flex", queued=queued, speed=1000.0, running=running,
                                  free_blocks=free_blocks, step_time_s=step_time_s),
                             duty=duty, duty_order=stamp, timestamp=core.clock()))


def roles(core: ConductorCore) -> tuple[list[str], list[str]]:
    names = core._names
    return ([names[s] for s in core.table.prefill_slots()], [names[s] for s in core.table.decode_slots()])


def test_a_flex_node_is_routed_to_as_its_duty():
    core = make()
    assert roles(core) == (["f0"], ["f1", "f2"])
    d = core.route("r", PROMPT)
    assert d.prefill_node == "f0" and d.decode_node in ("f1", "f2")
    assert core.status()["nodes"]["f0"]["duty"] == "prefill" and core.status()["nodes"]["f0"]["role"] == "flex"


def test_an_order_takes_the_node_out_of_routing_until_its_report_says_it_drained():
    core = make(replace(PLANNER, min_prefill_nodes=0), local=LOCAL)
    assert core.order_duty("f0", "decode") is Duty.TO_DECODE
    assert roles(core) == ([], ["f1", "f2"])
    d = core.route("r", PROMPT)                     # no prefill duty: the decode nodes prefill for themselves
    assert d.path == "local" and d.decode_node in ("f1", "f2")
    core.clock.t += 1
    report(core, "f0", "prefill", order=0.0)        # written before it took the order (whatever its time): stale
    assert roles(core) == ([], ["f1", "f2"])
    report(core, "f0", "draining-to-decode")
    assert roles(core) == ([], ["f1", "f2"])
    report(core, "f0", "decode")
    assert roles(core) == ([], ["f0", "f1", "f2"])
    assert core.registry.get("f0").duty is Duty.DECODE


def test_an_order_never_leaves_no_node_to_decode_or_without_local_prefill_none_to_prefill():
    core = make()
    with pytest.raises(DutyOrderRefused, match="last node in the prefill duty"):
        core.order_duty("f0", "decode")
    core.order_duty("f1", "prefill")
    with pytest.raises(DutyOrderRefused, match="last node in the decode duty"):
        core.order_duty("f2", "prefill")
    assert roles(core) == (["f0"], ["f2"])
    with pytest.raises(NoCandidateError):       # the draining node is routed nothing, f2 only decodes
        core.route("r", PROMPT, exclude=("f0",))


def test_a_node_that_was_never_told_is_believed_from_its_next_report():
    """The order never reached it (timed out): once the actor says so, the node's own reports put the
    Conductor back in step; until then a report without the order's stamp changes nothing."""
    core = make()
    core.order_duty("f1", "prefill")
    stamp = core.registry.get("f1").duty_ordered_at
    core.clock.t += 1
    report(core, "f1", "decode", order=0.0)
    assert roles(core) == (["f0"], ["f2"])
    core.duty_order_lost("f1", stamp)
    report(core, "f1", "decode", order=0.0)
    assert roles(core) == (["f0"], ["f1", "f2"])


def test_a_flex_node_restarted_in_its_launch_duty_is_ordered_back():
    """Ray restarts a dead actor with its constructor's arguments: a node launched as prefill and
    since ordered to decode comes back as prefill. The Conductor orders it back to decode."""
    core = make(replace(PLANNER, min_prefill_nodes=0), local=LOCAL)
    core.order_duty("f0", "decode")
    report(core, "f0", "decode")
    assert roles(core) == ([], ["f0", "f1", "f2"])
    core.register_node("f0", "flex", host(), duty="prefill")      # the restarted actor registers
    assert core.duty_to_restore("f0") is Duty.DECODE
    assert roles(core) == ([], ["f1", "f2"])                       # draining until it says decode
    report(core, "f0", "decode")
    assert roles(core) == ([], ["f0", "f1", "f2"]) and core.duty_to_restore("f0") is None


def test_only_flex_nodes_change_duty_and_a_restarted_conductor_learns_duties_from_registration():
    core = ConductorCore(ConductorConfig(block_size=BS), clock=_Clock())
    core.register_node("p", "prefill", host())
    core.register_node("f", "flex", host(), duty="draining-to-prefill")
    with pytest.raises(DutyOrderRefused, match="only flex nodes"):
        core.order_duty("p", "decode")
    assert roles(core) == (["p"], [])                   # draining: routed nothing
    with pytest.raises(ValueError, match="needs local_prefill"):
        ConductorConfig(duties=DutyPlannerConfig(min_prefill_nodes=0))


def test_the_planner_adds_a_prefill_node_once_prompt_work_queued_long_enough():
    core = make()
    report(core, "f0", "prefill", queued=5000)           # 5 s of prompts queued at 1000 tokens/s
    report(core, "f1", "decode", running=3)
    report(core, "f2", "decode", running=1)
    assert core.plan_duties() is None                    # the pressure starts now
    core.clock.t += 3.9
    assert core.plan_duties() is None                    # not held for 4 s yet
    core.clock.t += 0.2
    order = core.plan_duties()
    assert order is not None and (order.node, order.duty) == ("f2", Duty.PREFILL)   # the lighter decoder
    assert "prompt wait 5.00s > 2s" in order.reason
    assert roles(core) == (["f0"], ["f1"])               # f2 drains: routed nothing
    assert core.status()["duty_orders"][-1]["node"] == "f2"
    core.clock.t += 10                                   # past the cooldown, but f2 still drains
    report(core, "f2", "draining-to-prefill", running=1)
    assert core.plan_duties() is None
    report(core, "f2", "prefill")
    assert roles(core) == (["f0", "f2"], ["f1"])


def test_the_planner_never_takes_the_last_decode_node():
    core = make(replace(PLANNER, min_decode_nodes=2))
    report(core, "f0", "prefill", queued=50000)
    for _ in range(3):
        core.plan_duties()
        core.clock.t += 5
    assert core.duties.orders == []


def test_the_planner_releases_an_idle_prefill_node_only_when_decode_needs_it():
    """Decoders that keep their pace and have KV to spare keep the prefill node where it is; once the
    decode nodes run short of KV blocks (or, with a step-time target, their steps grow slow), the
    idle prefill node takes up decode."""
    core = make(replace(PLANNER, min_prefill_nodes=0), local=LOCAL)
    report(core, "f1", "decode", running=4, step_time_s=0.2)
    for _ in range(6):
        core.plan_duties()
        core.clock.t += 2.0
    assert core.plan_duties() is None
    report(core, "f1", "decode", running=40, free_blocks=50)     # 95% of both pools in use
    report(core, "f2", "decode", running=40, free_blocks=50)
    core.plan_duties()
    core.clock.t += 4.0
    order = core.plan_duties()
    assert order is not None and (order.node, order.duty) == ("f0", Duty.DECODE)
    assert "95% of a decode node's KV in use (pressure 1.06)" in order.reason and "prompt wait 0.00s" in order.reason
    report(core, "f0", "decode")
    assert roles(core) == ([], ["f0", "f1", "f2"])
    d = core.route("r", PROMPT)                          # every node decodes: prompts go local
    assert d.path == "local"


def test_an_idle_cluster_and_a_short_spike_move_nothing():
    core = make(replace(PLANNER, min_prefill_nodes=0), local=LOCAL)
    for _ in range(4):                                   # idle, no decode work: nothing to gain
        core.plan_duties()
        core.clock.t += 2
    assert core.duties.orders == []
    report(core, "f0", "prefill", queued=5000)
    core.plan_duties()
    core.clock.t += 2
    report(core, "f0", "prefill", queued=0)              # drained within the hold
    core.plan_duties()
    core.clock.t += 3
    assert core.plan_duties() is None


def test_planner_hysteresis_on_signals_alone():
    planner = DutyPlanner(PLANNER)
    flex = (FlexState("a", Duty.DECODE, 0.0, 2.0), FlexState("b", Duty.DECODE, 0.0, 1.0))
    busy = DutySignals(prompt_wait_s=3.0, decode_sequences=3.0, prefill_nodes=1, decode_nodes=2, flex=flex)
    assert planner.plan(0.0, busy) is None
    order = planner.plan(4.0, busy)
    assert order is not None and order.node == "b" and order.duty is Duty.PREFILL
    assert planner.plan(9.0, busy) is None               # cooldown (8 s); the hold restarts from here
    assert planner.plan(12.9, busy) is None              # past the cooldown, not yet held 4 s again
    assert planner.plan(13.0, busy) is not None
    between = replace(busy, prompt_wait_s=1.0)           # under its threshold, nothing decoding hard: no pressure
    planner = DutyPlanner(PLANNER)
    assert planner.plan(0.0, between) is None and planner.plan(100.0, between) is None
    with pytest.raises(ValueError):
        DutyPlannerConfig(busy_wait_s=0.0)
    with pytest.raises(ValueError):
        DutyPlannerConfig(leave_below=0.0)
    off = DutyPlanner(replace(PLANNER, enabled=False))
    assert off.plan(0.0, busy) is None and off.plan(10.0, busy) is None
    paused = DutyPlanner(PLANNER)
    paused.paused = True                                 # an operator orders duties by hand
    assert paused.plan(0.0, busy) is None and paused.plan(10.0, busy) is None
    paused.paused = False                                # the pressure held while paused counts
    assert paused.plan(10.0, busy) is not None


def test_a_duty_left_without_nodes_is_repaired_at_once():
    """The last decode-duty node died: the planner moves a prefill node across on its next tick,
    without waiting for a pressure to hold or for the cooldown of an order just given."""
    core = make(replace(PLANNER, min_prefill_nodes=0), local=LOCAL)
    core.order_duty("f1", "prefill")                # an operator's order: the cooldown starts now
    report(core, "f1", "prefill")
    core.mark_dead("f2", "killed")
    assert roles(core) == (["f0", "f1"], [])
    order = core.plan_duties()
    assert order is not None and order.duty is Duty.DECODE and "fewer than 1" in order.reason
    assert order.node in ("f0", "f1") and core.plan_duties() is None   # the drain counts toward decode


def test_an_operator_order_starts_the_cooldown_and_a_flapping_node_backs_off():
    planner = DutyPlanner(PLANNER)
    flex = (FlexState("a", Duty.DECODE, 0.0, 2.0), FlexState("b", Duty.DECODE, 0.0, 1.0))
    busy = DutySignals(prompt_wait_s=3.0, decode_sequences=3.0, prefill_nodes=1, decode_nodes=2, flex=flex)
    planner.plan(0.0, busy)
    planner.ordered(1.0, "a", Duty.PREFILL)         # by hand: no planner order within the cooldown
    assert planner.plan(5.0, busy) is None and planner.plan(8.9, busy) is None
    assert planner.plan(13.0, busy) is not None     # past the cooldown, busy since 5.0
    assert planner.backoff == 1.0
    planner.ordered(30.0, "a", Duty.DECODE)         # reverses a's last order: the next cooldown doubles
    assert planner.backoff == 2.0
    assert planner.plan(34.0, busy) is None and planner.plan(45.9, busy) is None
    assert planner.plan(46.0, busy) is not None     # 16 s after the reversal
    planner.ordered(200.0, "a", Duty.PREFILL)       # long after: the backoff was forgotten first
    assert planner.backoff == 2.0


def test_a_step_time_target_counts_as_decode_pressure():
    core = make(replace(PLANNER, min_prefill_nodes=0, decode_busy_step_s=0.15), local=LOCAL)
    report(core, "f1", "decode", running=4, step_time_s=0.1)
    report(core, "f2", "decode", running=4, step_time_s=0.3)        # mean 200 ms > 150 ms
    core.plan_duties()
    core.clock.t += 4.0
    order = core.plan_duties()
    assert order is not None and order.duty is Duty.DECODE and "decode steps 200 ms against 150 ms" in order.reason
    with pytest.raises(ValueError):
        DutyPlannerConfig(decode_busy_step_s=-1.0)


def test_a_node_leaves_a_side_only_if_that_side_stays_out_of_trouble():
    """Prompts queue, but the decode nodes' KV is 60% used: with one of two decode nodes gone the
    other would be at 120%, so no decode node is taken. Both sides in trouble: nothing moves."""
    planner = DutyPlanner(PLANNER)
    flex = (FlexState("a", Duty.DECODE, 0.0, 2.0), FlexState("b", Duty.DECODE, 0.0, 1.0),
            FlexState("p", Duty.PREFILL, 5.0, 0.0))
    queued = DutySignals(prompt_wait_s=5.0, decode_sequences=3.0, prefill_nodes=1, decode_nodes=2,
                         decode_kv_used=0.6, flex=flex)
    assert planner.decode_pressure(queued, 1)[0] == pytest.approx(1.2 / 0.9)
    assert planner.plan(0.0, queued) is None and planner.plan(10.0, queued) is None
    roomy = replace(queued, decode_kv_used=0.2)                  # 0.4 / 0.9 = 0.44 < 0.5 with one fewer
    assert planner.plan(20.0, roomy) is None and planner.plan(24.0, roomy).duty is Duty.PREFILL
    # both sides in trouble, each able to spare a node by count: nothing moves, since either move
    # would push the side left past leave_below
    flex2 = flex + (FlexState("q", Duty.PREFILL, 5.0, 0.0),)
    both = replace(queued, decode_kv_used=0.95, decode_kv_used_max=0.95, prefill_nodes=2, flex=flex2)
    planner = DutyPlanner(PLANNER)
    assert planner.prompt_pressure(both) > 1 and planner.decode_pressure(both)[0] > 1
    assert planner.plan(0.0, both) is None and planner.plan(10.0, both) is None
    one_full = replace(roomy, decode_kv_used_max=0.95)            # the mean hides one full node
    assert planner.decode_pressure(one_full)[0] > 1
