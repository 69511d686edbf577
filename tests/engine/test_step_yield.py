"""Yielding steps (engine/step_yield.py): while more than one class (priority, tenant) has come to a
node lately, the prompts of the classes ranking after the first (priority, then the tokens computed
for the class lately) get `yield_step_tokens` a step, and none while one of the first class's
prompts can run. Hand-driven schedulers (test_scheduler.py's Sim, block accounting checked every
step), then RecentClasses' window on explicit clocks."""
from __future__ import annotations

import pytest

from raypd.engine.config import EngineConfig
from raypd.engine.errors import ConfigError
from raypd.engine.step_yield import MAX_CLASSES, RecentClasses
from raypd.protocol.sampling_params import SamplingParams
from tests.engine.test_scheduler import Sim
from tests.engine.test_tenant_share import add


def prompt(seed: int, n: int = 16) -> list[int]:
    return [seed * 100 + i for i in range(n)]


def tokens_by_request(sim: Sim) -> dict[str, int]:
    return {x.request.request_id: x.num_tokens for x in sim.step().items}


def flood_sim(policy: str = "fcfs", **config) -> Sim:
    config.setdefault("max_num_batched_tokens", 64)
    config.setdefault("chunked_prefill_size", 64)
    return Sim(num_blocks=256, max_running_requests=8, schedule_policy=policy, yield_step_tokens=4, **config)


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "srpt"])
def test_one_class_takes_the_whole_budget(policy):
    sim = flood_sim(policy)
    for i in range(3):
        add(sim, f"b-{i}", prompt(i), 1, "b")
    assert tokens_by_request(sim) == {"b-0": 16, "b-1": 16, "b-2": 16}
    sim.run()
    sim.check_drained()


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "srpt"])
def test_the_flood_yields_while_a_tenant_served_less_is_about(policy):
    sim = flood_sim(policy)
    for i in range(4):
        add(sim, f"b-{i}", prompt(i), 1, "b")
    assert tokens_by_request(sim) == {f"b-{i}": 16 for i in range(4)}   # b alone: whole steps
    sim.run()
    for i in range(4, 12):
        add(sim, f"b-{i}", prompt(i), 1, "b")
    add(sim, "a-0", prompt(50), 1, "a")   # served nothing lately: the favoured class
    assert tokens_by_request(sim) == {"a-0": 16}                        # alone in its step
    # a has nothing waiting, but it came within the window and was served 17 tokens to b's 68: b's
    # prompts take 4 tokens a step, however its queue-order counter compares with a's.
    steps = [tokens_by_request(sim) for _ in range(8)]
    assert all(sum(s.values()) == 4 for s in steps), steps
    add(sim, "a-1", prompt(51), 1, "a")
    assert tokens_by_request(sim) == {"a-1": 16}                        # no yielding token beside it
    sim.run()
    sim.check_drained()


def test_tenants_served_alike_do_not_yield():
    sim = flood_sim()
    add(sim, "a-0", prompt(50), 1, "a")
    add(sim, "b-0", prompt(0), 1, "b")
    assert tokens_by_request(sim) == {"a-0": 16, "b-0": 16}             # both served nothing: a tie
    sim.run()
    sim.check_drained()


@pytest.mark.parametrize("policy", ["fcfs", "srpt"])
def test_a_less_urgent_priority_yields_to_a_more_urgent_one(policy):
    sim = flood_sim(policy)
    for i in range(3):
        add(sim, f"low-{i}", prompt(i), 1, "t")
    add(sim, "urgent", prompt(9), 1, "t", priority=-1)
    assert tokens_by_request(sim) == {"urgent": 16}
    steps = [tokens_by_request(sim) for _ in range(4)]
    # The urgent class was seen within the window: the others take 4 prompt tokens a step.
    assert all(sum(s.values()) == 4 for s in steps[1:]), steps
    sim.run()
    sim.check_drained()


def test_a_favoured_prompt_that_cannot_start_leaves_the_step_to_the_yielding_ones():
    """No slot for the favoured request (one runs at a time, a yielding prompt holds it, and a
    tenant's share preempts nothing): the yielding prompt goes on in small steps, so the slot frees,
    and the favoured one then starts alone."""
    sim = Sim(num_blocks=256, max_running_requests=1, max_num_batched_tokens=64, chunked_prefill_size=64,
              yield_step_tokens=4)
    add(sim, "b-0", prompt(0), 1, "b")
    sim.run()                                    # b served 17 tokens
    add(sim, "a-0", prompt(50, 4), 1, "a")
    sim.run()                                    # a served 5: the favoured class from now on
    for i in range(1, 4):
        add(sim, f"b-{i}", prompt(i), 1, "b")
    assert tokens_by_request(sim) == {"b-1": 4}  # b yields
    add(sim, "a-1", prompt(51), 1, "a")          # no slot: b-1 holds it
    steps = [tokens_by_request(sim) for _ in range(3)]
    assert steps == [{"b-1": 4}] * 3             # b-1 goes on (the favoured one cannot start)
    assert tokens_by_request(sim) == {"a-1": 16}  # b-1 ended: a-1 alone, before b's queue
    sim.run()
    sim.check_drained()


def test_recent_classes_rank_by_priority_then_tokens_within_the_window():
    recent = RecentClasses(window_s=10)
    a, b, urgent = SamplingParams(tenant="a"), SamplingParams(tenant="b"), SamplingParams(tenant="b", priority=-1)
    recent.saw(a, now=0)
    recent.charge(a, 100, now=0)
    assert recent.favoured(now=1) is None                   # one class: nothing yields
    recent.saw(b, now=2)
    recent.charge(b, 30, now=2)
    # Rates: a 100 tokens over the 3 s it has been about, b 30 over its 1 s.
    assert recent.favoured(now=3) == (0, 30.0) and recent.rank(a) == (0, 100 / 3)
    recent.saw(a, now=9)                                    # a about again, its 100 tokens of t=0 ...
    assert recent.favoured(now=11) == (0, 0.0)              # ... out of the window: a served least
    recent.saw(urgent, now=11)
    assert recent.favoured(now=11.5) == (-1, 0)             # priority first
    assert recent.favoured(now=12.5) == (-1, 0) and recent.rank(b) == (0, 0)   # b (last seen at 2) gone
    assert recent.favoured(now=19.5) is None                # a (last seen at 9) gone too: urgent alone


def test_a_flood_that_came_later_at_a_higher_rate_ranks_after_a_steady_tenant():
    """The steady tenant has more tokens in the window, the flood a higher rate since it came."""
    recent = RecentClasses(window_s=30)
    steady, flood = SamplingParams(tenant="steady"), SamplingParams(tenant="flood")
    for t in range(30):
        recent.saw(steady, now=t)
        recent.charge(steady, 10, now=t)        # 300 tokens, 10 a second
    for t in range(25, 30):
        recent.saw(flood, now=t)
        recent.charge(flood, 40, now=t)         # 200 tokens, 40 a second
    assert recent.favoured(now=30) == (0, 10.0) and recent.rank(flood) == (0, 40.0)


def test_recent_classes_are_bounded():
    recent = RecentClasses(window_s=10)
    for i in range(MAX_CLASSES + 5):
        recent.saw(SamplingParams(tenant=f"t{i}"), now=0)
    recent.charge(SamplingParams(tenant="t0"), 50, now=0)   # forgotten: charges nobody
    assert recent.rank(SamplingParams(tenant="t0")) == (0, 0)
    assert recent.favoured(now=1) == (0, 0)


def test_engine_config_refuses_a_negative_step_or_an_empty_window():
    with pytest.raises(ConfigError, match="yield_step_tokens"):
        EngineConfig(yield_step_tokens=-1)
    with pytest.raises(ConfigError, match="yield_window_s"):
        EngineConfig(yield_window_s=0)


def test_the_flags_reach_the_engine_options():
    import argparse

    from raypd.cluster.cli.engine_args import add_engine_args, engine_options

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert "yield_step_tokens" not in engine_options(parser.parse_args([]))   # unset: the device's default
    options = engine_options(parser.parse_args(["--yield-step-tokens", "0", "--yield-window", "5"]))
    assert (options["yield_step_tokens"], options["yield_window_s"]) == (0, 5.0)
