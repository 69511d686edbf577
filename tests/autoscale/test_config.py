"""The --autoscale flag and AutoscaleConfig: every accepted form gives the ranges it names, and every
wrong value is refused with a message that says what is wrong."""
from __future__ import annotations

import pytest

from raypd.cluster.autoscale.config import AutoscaleConfig, AutoscaleConfigError, RoleRange, parse_autoscale
from raypd.protocol.roles import Role

PD = (Role.PREFILL, Role.DECODE, Role.DECODE)       # the roles a 1P2D deployment starts, with repeats


def test_a_bare_range_applies_to_every_started_role_once():
    assert parse_autoscale("1:4", PD) == (RoleRange(Role.PREFILL, 1, 4), RoleRange(Role.DECODE, 1, 4))
    assert parse_autoscale(" 2 : 3 ", [Role.MIXED]) == (RoleRange(Role.MIXED, 2, 3),)


def test_per_role_ranges_name_only_the_roles_they_scale():
    assert parse_autoscale("decode=2:6, prefill=0:4", PD) == (RoleRange(Role.DECODE, 2, 6),
                                                              RoleRange(Role.PREFILL, 0, 4))
    assert parse_autoscale("Flex=1:1", [Role.FLEX]) == (RoleRange(Role.FLEX, 1, 1),)


@pytest.mark.parametrize("text, started, message", [
    ("", PD, "empty; expected MIN:MAX or role=MIN:MAX"),
    ("1-4", PD, "'1-4' is not MIN:MAX or role=MIN:MAX"),
    ("1:4:5", PD, "'1:4:5' is not MIN:MAX"),
    ("one:four", PD, "(MIN and MAX whole numbers)"),
    ("1.5:4", PD, "'1.5:4' is not MIN:MAX"),
    ("prefill=1:4,1:2", PD, "'1:2' is not role=MIN:MAX"),
    ("=1:2", PD, "'=1:2' is not role=MIN:MAX"),
    ("prefill=", PD, "'prefill=' is not MIN:MAX"),
    ("gpu=1:2", PD, "unknown role 'gpu'; one of prefill, decode, mixed, flex"),
    ("flex=1:2", PD, "the deployment starts no flex nodes (it starts prefill, decode)"),
    ("1:2", (), "the deployment starts no nodes to scale"),
    ("prefill=3:1", PD, "'prefill=3:1': MIN 3 is above MAX 1"),
    ("-1:2", PD, "'-1:2': node counts cannot be negative"),
    ("decode=1:-2", PD, "node counts cannot be negative"),
    ("0:0", PD, "'0:0': MAX must be at least 1"),
    ("prefill=1:2,decode=1:2,prefill=1:3", PD, "prefill is given twice"),
])
def test_every_wrong_value_is_refused_with_its_reason(text, started, message):
    with pytest.raises(AutoscaleConfigError) as e:
        parse_autoscale(text, started)
    assert message in str(e.value)
    assert isinstance(e.value, ValueError)          # argparse and the Serve config's checks catch ValueError


@pytest.mark.parametrize("least, most, message", [(-1, 2, "MIN must be >= 0"), (0, 0, "MAX must be >= 1"),
                                                  (3, 2, "MIN 3 is above MAX 2")])
def test_a_role_range_checks_itself(least, most, message):
    with pytest.raises(AutoscaleConfigError, match=message):
        RoleRange(Role.DECODE, least, most)


def config(**fields) -> AutoscaleConfig:
    fields.setdefault("ranges", (RoleRange(Role.PREFILL, 1, 4), RoleRange(Role.DECODE, 1, 2)))
    return AutoscaleConfig(ttft_target_s=fields.pop("ttft_target_s", 1.0),
                           tpot_target_s=fields.pop("tpot_target_s", 0.1), **fields)


def test_the_config_finds_each_roles_range():
    c = config()
    assert c.roles == (Role.PREFILL, Role.DECODE)
    assert c.range_of(Role.DECODE) == RoleRange(Role.DECODE, 1, 2)
    assert c.range_of(Role.MIXED) is None


@pytest.mark.parametrize("fields, message", [
    ({"ranges": ()}, "no role to scale"),
    ({"ranges": (RoleRange(Role.MIXED, 1, 2), RoleRange(Role.MIXED, 1, 3))}, "a role has two ranges"),
    ({"ttft_target_s": 0.0}, "ttft_target_s must be > 0"),
    ({"tpot_target_s": -1.0}, "tpot_target_s must be > 0"),
    ({"window_s": 0.0}, "window_s must be > 0"),
    ({"tick_s": 0.0}, "tick_s must be > 0"),
    ({"queue_per_node": 0.0}, "queue_per_node must be > 0"),
    ({"drain_timeout_s": 0.0}, "drain_timeout_s must be > 0"),
    ({"up_hold_s": -1.0}, "up_hold_s must be >= 0"),
    ({"up_cooldown_s": -1.0}, "up_cooldown_s must be >= 0"),
    ({"down_hold_s": -1.0}, "down_hold_s must be >= 0"),
    ({"down_cooldown_s": float("nan")}, "down_cooldown_s must be >= 0"),
    ({"attainment": 0.0}, r"attainment must be in \(0, 1\]"),
    ({"attainment": 1.5}, r"attainment must be in \(0, 1\]"),
    ({"idle_share": 0.0}, r"idle_share must be in \(0, 1\]"),
    ({"kv_full": 1.1}, r"kv_full must be in \(0, 1\]"),
    ({"min_samples": 0}, "min_samples must be >= 1"),
])
def test_a_config_that_cannot_work_is_refused(fields, message):
    with pytest.raises(AutoscaleConfigError, match=message):
        config(**fields)
