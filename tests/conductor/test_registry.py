from __future__ import annotations

import pytest

from raypd.conductor.errors import InvalidRoleError, UnknownNodeError
from raypd.conductor.registry import NodeRegistry
from raypd.protocol.roles import Role
from tests.conductor.helpers import FakeClock, host, load


def test_register_heartbeat_and_expiry_with_injected_clock():
    clock = FakeClock()
    reg = NodeRegistry(heartbeat_timeout_s=5.0, clock=clock)
    a = reg.register("a", "prefill", host())
    b = reg.register("b", "decode", host())
    assert (a.slot, b.slot) == (0, 1) and a.role is Role.PREFILL and b.role is Role.DECODE
    clock.advance(4.0)
    reg.heartbeat("a")
    clock.advance(2.0)                      # b silent 6 s, a silent 2 s
    dead = reg.expire()
    assert [x.name for x in dead] == ["b"]
    assert "b" not in reg and "a" in reg
    assert "no heartbeat" in reg.get("b").death_reason
    with pytest.raises(UnknownNodeError):
        reg.heartbeat("b")


def test_load_report_counts_as_heartbeat():
    clock = FakeClock()
    reg = NodeRegistry(heartbeat_timeout_s=5.0, clock=clock)
    reg.register("a", "prefill", host())
    clock.advance(4.0)
    reg.report_load(load("a", queued=7))
    clock.advance(4.0)
    assert reg.expire() == []
    assert reg.get("a").load.queued_prefill_tokens == 7


def test_dead_slot_is_reused_and_reregister_replaces():
    reg = NodeRegistry(clock=FakeClock())
    reg.register("a", "prefill", host())
    reg.register("b", "mixed", host())
    assert reg.mark_dead("a", "killed") is not None
    assert reg.mark_dead("a") is None       # already dead
    c = reg.register("c", "decode", host())
    assert c.slot == 0 and reg.by_slot(0).name == "c"
    b1 = reg.get("b")
    b2 = reg.register("b", "mixed", host())  # a restart under the same name
    assert not b1.alive and b1.death_reason == "re-registered"
    assert b2.slot == 1 and reg.by_slot(1) is b2
    assert {x.name for x in reg.alive()} == {"b", "c"}
    assert reg.num_slots == 2


def test_invalid_role_and_unknown_node():
    reg = NodeRegistry()
    with pytest.raises(InvalidRoleError):
        reg.register("a", "router", host())
    with pytest.raises(UnknownNodeError):
        reg.get("nope")
