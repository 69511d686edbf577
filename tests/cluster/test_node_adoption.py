"""What a starting node pool adopts, starts and kills (cluster/launch/adoption.py), and when a
stopping one leaves its nodes to its successor (cluster/serve/node_pool.py), on hand-built listings
and statuses. The real failure (the pool replica SIGKILLed under streams) is in
tests/cluster/test_fault_tolerance.py."""
from __future__ import annotations

import pytest

from raypd.cluster.launch.adoption import (
    app_namespace,
    find,
    missing,
    new_deployment_id,
    next_indices,
    parse_namespace,
    parse_node_name,
)
from raypd.cluster.serve.node_pool import successor_adopts
from raypd.protocol.duty import Duty
from raypd.protocol.roles import Role

OLD, OURS, NEWER = "1764620000000-aaaaaa", "1764627300123-abcdef", "1764630000000-000000"
NS = app_namespace("raypd", OURS)


def entry(name: str, namespace: str = NS) -> dict:
    return {"name": name, "namespace": namespace}


def test_namespaces_name_the_app_and_its_deployment():
    assert NS == "raypd/raypd/1764627300123-abcdef"
    assert parse_namespace(NS) == ("raypd", OURS)
    assert parse_namespace(app_namespace("team/a-b", OURS)) == ("team/a-b", OURS)   # an app name with a slash
    for other in ("serve", "raypd-tests", "raypd", "raypd/", "raypd/app", "other/raypd/x"):
        assert parse_namespace(other) is None, other


def test_deployment_ids_sort_as_they_were_made():
    first = new_deployment_id()
    second = new_deployment_id()
    assert first != second and len(first) == len(second) == 20
    assert first[:13] <= second[:13]


def test_node_names():
    assert parse_node_name("raypd", "raypd-prefill-0") == (Role.PREFILL, 0)
    assert parse_node_name("raypd", "raypd-flex-12") == (Role.FLEX, 12)
    assert parse_node_name("my-app", "my-app-decode-3") == (Role.DECODE, 3)
    for other in ("raypd-conductor", "raypd-prefill-x", "raypd-router-0", "other-prefill-0", "raypd-prefill"):
        assert parse_node_name("raypd", other) is None, other


def test_a_restarted_pool_adopts_its_own_deployments_nodes_and_kills_what_older_ones_left():
    listing = [entry("raypd-decode-1"), entry("raypd-prefill-10"), entry("raypd-prefill-2"), entry("raypd-conductor"),
               entry("SERVE_CONTROLLER_ACTOR", "serve"),
               entry("raypd-prefill-0", app_namespace("raypd", OLD)),       # an older deployment's leftovers
               entry("raypd-conductor", app_namespace("raypd", OLD)),
               entry("raypd-prefill-0", app_namespace("raypd", NEWER)),     # a newer deployment: not ours to touch
               entry("raypd-prefill-0", app_namespace("other", OLD)),       # another app
               entry("raypd-prefill-0", "raypd-tests")]
    found = find(listing, NS, "raypd")
    assert found.nodes == ("raypd-prefill-2", "raypd-prefill-10", "raypd-decode-1")   # as a first start lists them
    assert found.conductor
    assert found.stale == ((app_namespace("raypd", OLD), "raypd-conductor"),
                           (app_namespace("raypd", OLD), "raypd-prefill-0"))


def test_a_first_start_finds_nothing():
    found = find([entry("SERVE_CONTROLLER_ACTOR", "serve")], NS, "raypd")
    assert found.nodes == () and not found.conductor and found.stale == ()


def test_only_what_the_adopted_nodes_do_not_cover_is_started():
    roles = [Role.PREFILL, Role.PREFILL, Role.DECODE, Role.DECODE]
    assert missing(roles, [None] * 4, [Role.PREFILL, Role.DECODE, Role.DECODE]) == [(Role.PREFILL, None)]
    assert missing(roles, [None] * 4, []) == [(r, None) for r in roles]
    assert missing(roles, [None] * 4, [Role.PREFILL] * 3 + [Role.DECODE] * 2) == []   # the scaler had added some
    flex = [Role.FLEX] * 3
    assert missing(flex, [Duty.PREFILL, Duty.DECODE, Duty.DECODE], [Role.FLEX]) == [(Role.FLEX, Duty.DECODE)] * 2


def test_new_nodes_are_numbered_after_the_adopted_ones():
    assert next_indices("raypd", ["raypd-prefill-0", "raypd-prefill-3", "raypd-decode-1", "raypd-conductor"]) == \
        {Role.PREFILL: 4, Role.DECODE: 2}
    assert next_indices("raypd", []) == {}


@pytest.mark.parametrize("status,adopts", [
    ("RUNNING", True), ("UNHEALTHY", True),            # Serve replaces the replica within the deployment
    ("DELETING", False), ("DEPLOYING", False),         # serve.delete / serve.shutdown; a new config's deployment
    ("DEPLOY_FAILED", False), (None, False),           # gone, or Serve does not answer: nothing would adopt them
])
def test_a_stopping_pool_leaves_its_nodes_only_to_a_successor_in_the_same_deployment(status, adopts):
    assert successor_adopts(status) is adopts
