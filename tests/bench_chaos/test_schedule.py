"""The kill plan: times, kinds rotating through every kind the targets can take, seeded target
choice among live members, never the last live node of a role, no engine crash for the Conductor."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from raypd.benchmarks.chaos.schedule import KINDS, KillSchedule, parse_targets


@dataclass(frozen=True)
class T:
    name: str
    role: str


CLUSTER = [T("raypd-conductor", "conductor"), T("raypd-decode-0", "decode"), T("raypd-decode-1", "decode"),
           T("raypd-prefill-0", "prefill"), T("raypd-prefill-1", "prefill")]
ALL_LIVE = {t.name for t in CLUSTER}


def test_times_start_at_the_interval_and_stay_inside_the_run():
    s = KillSchedule(duration_s=180, every_s=30, roles=["prefill", "decode", "conductor"])
    assert [k.t_s for k in s.planned] == [30, 60, 90, 120, 150]
    assert KillSchedule(40, 15, ["decode"]).planned[-1].t_s == 30
    assert KillSchedule(10, 15, ["decode"]).planned == []


def test_kinds_rotate_so_every_kind_happens():
    s = KillSchedule(180, 30, ["prefill", "decode", "conductor"])
    assert [k.kind for k in s.planned] == ["ray_kill", "sigkill", "engine_crash", "ray_kill", "sigkill"]
    assert {k.kind for k in s.planned} == set(KINDS)


def test_conductor_only_never_plans_an_engine_crash():
    s = KillSchedule(100, 10, ["conductor"])
    assert {k.kind for k in s.planned} == {"ray_kill", "sigkill"}
    assert s.eligible("engine_crash", CLUSTER, ALL_LIVE) == []


def test_target_choice_is_seeded():
    def picks(seed: int) -> list[str]:
        s = KillSchedule(1000, 10, ["prefill", "decode", "conductor"], seed=seed)
        return [s.pick(k.kind, CLUSTER, ALL_LIVE).name for k in s.planned]  # type: ignore[union-attr]
    assert picks(7) == picks(7)
    assert picks(7) != picks(8)
    assert set(picks(7)) == ALL_LIVE  # 99 draws reach every member


def test_only_allowed_roles_and_live_members():
    s = KillSchedule(100, 10, ["decode", "conductor"])
    assert [t.name for t in s.eligible("ray_kill", CLUSTER, ALL_LIVE)] == [
        "raypd-conductor", "raypd-decode-0", "raypd-decode-1"]
    assert [t.name for t in s.eligible("engine_crash", CLUSTER, ALL_LIVE)] == ["raypd-decode-0", "raypd-decode-1"]
    live = ALL_LIVE - {"raypd-conductor"}
    assert "raypd-conductor" not in [t.name for t in s.eligible("sigkill", CLUSTER, live)]


def test_the_last_live_node_of_a_role_is_a_target_unless_spared():
    s = KillSchedule(100, 10, ["prefill", "decode"])
    live = ALL_LIVE - {"raypd-decode-0"}  # decode-0 is restarting: decode-1 is the last live decode node
    assert [t.name for t in s.eligible("sigkill", CLUSTER, live)] == [
        "raypd-decode-1", "raypd-prefill-0", "raypd-prefill-1"]
    s = KillSchedule(100, 10, ["prefill", "decode"], spare_last_node=True)
    live = ALL_LIVE - {"raypd-decode-0"}  # decode-0 is restarting: decode-1 is the last live decode node
    assert [t.name for t in s.eligible("sigkill", CLUSTER, live)] == ["raypd-prefill-0", "raypd-prefill-1"]
    one_prefill = [t for t in CLUSTER if t.name != "raypd-prefill-1"]
    assert s.pick("ray_kill", one_prefill, live) is None


@pytest.mark.parametrize("roles", [[], ["gpu"], ["decode", "nodes"]])
def test_unknown_or_no_roles_are_refused(roles):
    with pytest.raises(ValueError):
        KillSchedule(100, 10, roles)


@dataclass(frozen=True)
class H:
    name: str
    role: str


HOSTS = [H("h1", "prefill"), H("h2", "decode"), H("h3", "prefill"), H("h4", "decode")]


def test_host_targets_parse_and_rotate_after_the_role_kinds():
    assert parse_targets("host, partition") == ["host", "partition"]
    with pytest.raises(ValueError, match="targets must be some of"):
        parse_targets("host,rack")
    s = KillSchedule(180, 30, ["host", "partition"])
    assert [k.kind for k in s.planned] == ["host_kill", "partition", "host_kill", "partition", "host_kill"]
    assert s.roles == frozenset() and s.eligible("ray_kill", CLUSTER, ALL_LIVE) == []
    mixed = KillSchedule(180, 30, ["decode", "partition"])
    assert mixed.kinds == ["ray_kill", "sigkill", "engine_crash", "partition"]
    assert KillSchedule(100, 10, ["host"]).kinds == ["host_kill"]


def test_a_host_kill_spares_the_last_live_host_of_a_role_and_a_partition_does_not():
    s = KillSchedule(180, 30, ["host", "partition"], seed=3)
    live = {"h1", "h2", "h3"}   # h4 lost: h2 is the last decode host
    assert {s.pick_host("host_kill", HOSTS, live).name for _ in range(30)} == {"h1", "h3"}
    assert {s.pick_host("partition", HOSTS, live).name for _ in range(30)} == {"h1", "h2", "h3"}
    assert s.pick_host("host_kill", HOSTS, {"h1", "h2"}) is None
    assert KillSchedule(180, 30, ["partition"]).pick_host("host_kill", HOSTS, live) is None  # not a target
