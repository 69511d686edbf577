"""Each principal has its own keys: derived per name from the deployment's secret by the control plane,
the secret itself never in what a node is handed; keyed addresses carry whose server listens there;
a principal owns only its own endpoint names; the allow-list maps a key to exactly one principal."""
from __future__ import annotations

import pickle

import pytest

from raypd.kvtransfer.data_plane_auth import DataPlaneSecret
from raypd.kvtransfer.identity import (
    ANY,
    DataPlaneIdentity,
    PeerKeys,
    UnkeyedAddressError,
    connection_id,
    owns,
    split_address,
)

SECRET = DataPlaneSecret.generate()


def test_each_node_has_its_own_keys_and_a_restart_under_its_name_has_the_same():
    a, b = SECRET.identity("raypd-decode-0"), SECRET.identity("raypd-decode-1")
    assert a.public_key != b.public_key and a.secret_key != b.secret_key
    again = SECRET.identity("raypd-decode-0")  # what Ray's restart builds from the same arguments
    assert (again.public_key, again.secret_key) == (a.public_key, a.secret_key)
    other = DataPlaneSecret.generate().identity("raypd-decode-0")  # another deployment's node of that name
    assert other.public_key != a.public_key


def test_a_node_is_handed_its_own_keys_and_its_peers_public_keys_but_never_the_secret():
    node = SECRET.identity("raypd-prefill-0", ["raypd-decode-0", "raypd-decode-1"])
    sent = pickle.dumps(node)  # what Ray hands the node actor
    assert SECRET._value not in sent  # type: ignore[attr-defined]
    assert SECRET.key_pair_of("raypd-decode-0")[1] not in sent  # nor any peer's secret key
    back = pickle.loads(sent)
    assert (back.principal, back.public_key, back.secret_key) == (node.principal, node.public_key, node.secret_key)
    assert back.peers.as_dict() == {n: SECRET.public_key_of(n)
                                    for n in ("raypd-prefill-0", "raypd-decode-0", "raypd-decode-1")}


def test_a_keyed_address_round_trips_and_an_unkeyed_one_is_refused():
    node = SECRET.identity("raypd-prefill-0")
    address = node.address("tcp://10.0.0.7:5555")
    assert split_address(address) == ("tcp://10.0.0.7:5555", node.public_key)
    for bad in ("tcp://10.0.0.7:5555", "tcp://10.0.0.7:5555?curve=abc", "?curve=" + "00" * 32,
                "tcp://h:1?curve=" + "zz" * 32):
        with pytest.raises(UnkeyedAddressError):
            split_address(bad)


def test_a_principal_owns_its_name_and_its_suffixed_endpoints_only():
    assert owns("raypd-prefill-1", "raypd-prefill-1") and owns("raypd-prefill-1", "raypd-prefill-1-import")
    assert not owns("raypd-prefill-1", "raypd-prefill-10") and not owns("raypd-prefill-1", "raypd-prefill-0")
    assert not owns("raypd-decode-1", "raypd-prefill-1-import")
    assert owns(ANY, "anything")  # the shared identity of one process or one tool


def test_the_allow_list_maps_a_key_to_one_principal_and_a_new_key_replaces_the_old():
    peers = PeerKeys({"d0": SECRET.public_key_of("d0")})
    assert peers.principal_of(SECRET.public_key_of("d0")) == "d0"
    assert peers.principal_of(SECRET.public_key_of("d0").decode()) == "d0"  # as ZMQ's User-Id gives it
    rekeyed = DataPlaneIdentity.generate("d0")
    peers.admit("d0", rekeyed.public_key)
    assert peers.principal_of(SECRET.public_key_of("d0")) is None and peers.principal_of(rekeyed.public_key) == "d0"
    peers.forget("d0")
    assert peers.principal_of(rekeyed.public_key) is None and len(peers) == 0
    with pytest.raises(ValueError):
        peers.admit("d1", b"not a key")


def test_connection_ids_name_connections_not_peers():
    ids = {connection_id("raypd-decode-0") for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith(b"raypd-decode-0/") for i in ids)
