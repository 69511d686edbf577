"""Every node class has the one Ray-callable surface (node/node_actor.py), written once: what the
Conductor, the node pool, the benches and the chaos tests call works on any role."""
from __future__ import annotations

import inspect

import pytest

from raypd.decode_node.decode_node import DecodeNode
from raypd.flex_node.flex_node import FlexNode
from raypd.node.mixed_node import MixedNode
from raypd.node.node_actor import NodeActor
from raypd.prefill_node.prefill_node import PrefillNode

SHARED = {"ready", "abort", "load_report", "published_load", "stats", "drain_kv_events", "kv_snapshot", "check_idle",
          "attach_conductor", "admit_peers", "crash_engine", "fail_requests", "hold_steps", "shutdown"}
OWN = {PrefillNode: {"prefill", "export_prefix", "import_prefix", "abort_migration"},
       DecodeNode: {"generate"}, MixedNode: {"generate"},
       FlexNode: {"prefill", "generate", "export_prefix", "import_prefix", "abort_migration", "set_duty"}}


def callables(cls: type) -> set[str]:
    return {name for name, f in inspect.getmembers(cls, inspect.iscoroutinefunction) if not name.startswith("_")}


@pytest.mark.parametrize("cls", list(OWN), ids=lambda c: c.__name__)
def test_each_node_class_has_the_shared_surface_and_only_its_own_calls_besides(cls):
    assert issubclass(cls, NodeActor)
    assert callables(NodeActor) == SHARED
    assert callables(cls) == SHARED | OWN[cls]
    redefined = SHARED & set(vars(cls))
    assert not redefined, f"{cls.__name__} writes the shared calls again: {redefined}"
