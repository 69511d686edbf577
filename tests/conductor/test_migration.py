"""The hot-prefix migration trigger: fires when it should, and not when any condition fails."""
from __future__ import annotations

from dataclasses import replace

from raypd.conductor.config import MigrationConfig
from raypd.conductor.planners.hot_prefix import HotPrefixTracker
from raypd.conductor.planners.migration import MigrationStatus
from tests.conductor.helpers import EventMaker, batch, load
from tests.conductor.test_policies import PREFIX, PROMPT, make_core

MIG = MigrationConfig(enabled=True, hot_score=3.0, min_prefix_tokens=256, overload_queue_s=1.0,
                      light_queue_s=0.25, window_s=30.0, margin=2.0, max_concurrent=1, half_life_s=30.0,
                      cooldown_s=10.0, timeout_s=5.0)


def core_with(mig: MigrationConfig = MIG, policy: str = "cache_aware", *more_prefixes):
    core = make_core(policy, migration=mig)
    em = EventMaker(16)
    core.report_kv_events(batch("p0", em.stored(PREFIX), *(em.stored(p) for p in more_prefixes)))
    return core


def hammer(core, n: int, prompt=PROMPT, **queued):
    """n requests for the hot prompt, each after fresh load reports (so routed-since-report load
    does not accumulate in the test)."""
    plans = []
    for _ in range(n):
        for name, q in queued.items():
            core.report_load(load(name, queued=q, speed=1000.0))
        d = core.route(f"r{len(core.log)}", prompt)
        if d.migration is not None:
            plans.append(d.migration)
    return plans


def test_fires_for_a_hot_prefix_on_overloaded_holders_with_a_light_target():
    core = core_with()
    plans = hammer(core, 3, p0=5000, p1=0, p2=0)
    assert len(plans) == 1
    plan = plans[0]
    # p1 and p2 are both idle; p1 shares p0's ToR so the copy is faster
    assert (plan.source, plan.target, plan.num_tokens) == ("p0", "p1", 960)
    assert plan.token_ids == tuple(PREFIX)
    assert plan.est_saving_s > MIG.margin * plan.est_cost_s
    assert core.take_migrations() == [plan] and plan.status is MigrationStatus.RUNNING
    # the target's own KV events show the copy landed
    core.report_kv_events(batch("p1", EventMaker(16).stored(PREFIX)))
    assert plan.status is MigrationStatus.DONE
    st = core.status()
    assert st["migrations"]["finished"] == 1 and st["nodes"]["p1"]["migrations_in"] == 1


def test_not_before_the_prefix_is_hot():
    assert hammer(core_with(), 2, p0=5000, p1=0, p2=0) == []


def test_not_while_a_holder_keeps_up():
    assert hammer(core_with(), 6, p0=500, p1=0, p2=0) == []         # 0.5 s < 1 s overload


def test_not_without_a_lightly_loaded_target():
    assert hammer(core_with(), 6, p0=5000, p1=1000, p2=1000) == []  # 1 s > 0.25 s light


def test_not_when_the_saving_does_not_cover_the_transfer():
    # a 10 ms window expects ~0.001 more hits: the copy (~4 ms) would not pay for itself
    assert hammer(core_with(replace(MIG, window_s=0.01)), 6, p0=5000, p1=0, p2=0) == []


def test_not_for_short_prefixes():
    assert hammer(core_with(replace(MIG, min_prefix_tokens=2000)), 6, p0=5000, p1=0, p2=0) == []


def test_bounded_concurrency_cooldown_and_timeout():
    other = list(range(20_000, 21_000))
    core = core_with(replace(MIG, max_concurrent=1), "cache_aware", other[:960])
    assert len(hammer(core, 3, p0=5000, p1=0, p2=0)) == 1
    core.take_migrations()
    # a second hot prefix waits: one migration in flight at most
    assert hammer(core, 4, prompt=other, p0=5000, p1=0, p2=0) == []
    # the first one times out (no events from p1) and fails; its prefix cools down
    core.clock.advance(MIG.timeout_s + 1)
    res = core.tick()
    assert [p.error for p in res.expired_migrations] == ["timed out"]
    assert core.status()["migrations"]["failed"] == 1
    assert hammer(core, 3, p0=5000, p1=0, p2=0) == []                # PROMPT's prefix cools down
    assert len(hammer(core, 1, prompt=other, p0=5000, p1=0, p2=0)) == 1   # the other one goes


def test_a_dead_target_fails_its_migration():
    core = core_with()
    [plan] = hammer(core, 3, p0=5000, p1=0, p2=0)
    core.take_migrations()
    core.mark_dead("p1")
    assert plan.status is MigrationStatus.FAILED and "died" in plan.error


def test_scores_decay_with_the_half_life():
    hot = HotPrefixTracker(half_life_s=10.0)
    e = hot.hit(1, 16, 32, list(range(32)), now=0.0)
    hot.hit(1, 16, 32, list(range(32)), now=0.0)
    assert hot.score(e, 0.0) == 2.0
    assert abs(hot.score(e, 10.0) - 1.0) < 1e-9
    assert abs(hot.score(e, 20.0) - 0.5) < 1e-9
    small = HotPrefixTracker(half_life_s=10.0, max_tracked=4)
    for k in range(10):
        small.hit(k, 16, 16, [k] * 16, now=float(k))
    assert len(small) <= 4 and small.get(9) is not None


def test_fires_on_predicted_overload_before_queues_build():
    """Hits arriving faster than one holder can serve them: each needs ~0.205 s of prefill beyond
    the prefix, and n hits at once with a 1 s half-life stand for n x 0.69 req/s, so the 6th hit
    means 0.85 s of work per second (> 0.8) while the holder's queue is only this one request."""
    core = core_with(replace(MIG, half_life_s=1.0))
    prompt = PREFIX + list(range(50_000, 50_200))
    assert hammer(core, 5, prompt=prompt, p0=0, p1=0, p2=0) == []
    assert core.status()["migrations"]["skips"]["holders_keep_up"] == 5 - int(MIG.hot_score) + 1
    plans = hammer(core, 1, prompt=prompt, p0=0, p1=0, p2=0)
    assert len(plans) == 1 and plans[0].source == "p0" and plans[0].target in ("p1", "p2")
