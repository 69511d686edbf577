"""The Conductor's side of a drain: a retiring node is routed nothing new and moved by no planner,
its load still counts; the last node of a kind cannot retire; a drain called off routes it again."""
from __future__ import annotations

import pytest

from raypd.conductor.config import ConductorConfig, LocalPrefillConfig
from raypd.conductor.core import ConductorCore
from raypd.conductor.errors import DutyOrderRefused, NoCandidateError, RetireRefused
from tests.conductor.helpers import host, load

PROMPT = list(range(1000, 1064))


def cluster(*nodes: tuple[str, str], local: bool = False) -> ConductorCore:
    core = ConductorCore(ConductorConfig(block_size=16, local_prefill=LocalPrefillConfig(enabled=local)))
    for name, role in nodes:
        core.register_node(name, role, host(), duty="decode" if role == "flex" else "")
        core.report_load(load(name, role))
    return core


def test_a_retiring_node_gets_no_new_request_and_comes_back_when_the_drain_is_called_off():
    core = cluster(("m0", "mixed"), ("m1", "mixed"))
    core.retire_node("m1")
    assert {core.route(f"r{i}", PROMPT).decode_node for i in range(8)} == {"m0"}
    assert core.status()["nodes"]["m1"]["retiring"] is True
    core.report_load(load("m1", "mixed", running=3))        # its requests still run and report
    assert core.status()["nodes"]["m1"]["running"] == 3
    core.retire_node("m1", retiring=False)
    assert "m1" in {core.route(f"s{i}", PROMPT, exclude=("m0",)).decode_node for i in range(2)}


def test_the_last_node_to_decode_cannot_retire_and_stays_routed():
    core = cluster(("p0", "prefill"), ("d0", "decode"), ("d1", "decode"))
    core.retire_node("d0")
    with pytest.raises(RetireRefused, match=r"d1 is the last node to decode \(others draining: d0\)"):
        core.retire_node("d1")
    assert core.route("r", PROMPT).decode_node == "d1"
    with pytest.raises(NoCandidateError):
        core.route("r2", PROMPT, exclude=("d1",))


def test_the_last_prefill_node_may_retire_only_when_decode_nodes_prefill_for_themselves():
    with pytest.raises(RetireRefused, match="last node to prefill"):
        cluster(("p0", "prefill"), ("d0", "decode")).retire_node("p0")
    core = cluster(("p0", "prefill"), ("d0", "decode"), local=True)
    core.retire_node("p0")
    d = core.route("r", PROMPT)
    assert d.path == "local" and d.decode_node == "d0"


def test_a_retiring_flex_node_is_neither_ordered_nor_counted_by_the_duty_planner():
    core = cluster(("f0", "flex"), ("f1", "flex"), ("f2", "flex"))
    core.order_duty("f0", "prefill")
    core.retire_node("f2")
    with pytest.raises(DutyOrderRefused, match="being drained"):
        core.order_duty("f2", "prefill")
    assert [f.name for f in core.duty_signals().flex] == ["f0", "f1"]
