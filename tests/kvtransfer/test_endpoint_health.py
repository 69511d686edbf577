"""EndpointHealth (kvtransfer/bootstrap/endpoint_health.py): an endpoint is broken once it was made
while its host had no network and its backend then refused a peer, having accepted none. The rule
alone, the host's interfaces read from a sysfs tree, then on KVSenders and KVReceivers in this
process over the fake backend, whose `unreachable` switch plays a UCX worker made while its host's
link was down, and whose "made offline" is what the host's interfaces said when it was made (here
replaced for the endpoints a test makes inside `made_offline()`; real ZMQ sockets on 127.0.0.1)."""
from __future__ import annotations

import logging

import pytest
import torch

from raypd.kvtransfer import EndpointBrokenError, KVReceiver, KVSender, LayoutError, TransferConfig, TransferError
from raypd.kvtransfer import TransferState as S
from raypd.kvtransfer.bootstrap.endpoint_health import EndpointHealth, host_network_up
from tests.kvtransfer.offline import made_offline

CFG = TransferConfig(backend="fake", bootstrap_timeout_s=5.0, wait_timeout_s=5.0, transfer_timeout_s=5.0,
                     heartbeat_interval_s=0.1, heartbeat_timeout_s=5.0)
W = 10.0  # generous bound on any wait
UNREACHABLE = TransferError("UCX endpoint create failed: Destination is unreachable")


def pools(seed: int, blocks: int = 16, slots: int = 4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(blocks, 2, 2, 4, 2, 8, generator=g), torch.randint(0, 1 << 30, (slots, 4), generator=g)


# -- the rule ----------------------------------------------------------------------------------------
def test_made_offline_and_refused_is_broken_with_the_reason(caplog):
    health = EndpointHealth("prefill-0", made_offline=True)
    with caplog.at_level(logging.ERROR, logger="raypd.kvtransfer.bootstrap.endpoint_health"):
        first = health.add_peer_failed("decode-a", UNREACHABLE)
        health.add_peer_failed("decode-b", UNREACHABLE)
    assert first == "backend refused the peer: TransferError: UCX endpoint create failed: Destination is unreachable"
    assert health.broken == ("it was made while its host had no network (no interface but loopback had a carrier), "
                             f"and its backend has reached no peer since: decode-a refused it: {first}")
    assert [r.getMessage() for r in caplog.records] == [f"prefill-0: endpoint broken, only a new process mends it: "
                                                        f"{health.broken}"]   # logged once


def test_made_with_the_network_up_no_refusal_condemns_it():
    """The peers may be the broken ones (receivers made during a cut): a healthy sender must not restart."""
    health = EndpointHealth("prefill-0", made_offline=False)
    for peer in ("decode-a", "decode-b", "decode-c"):
        health.add_peer_failed(peer, UNREACHABLE)
        health.registration_refused(peer, "backend refused the peer: TransferError: unreachable")
    assert health.broken is None


def test_after_one_acceptance_refusals_are_the_peers_problem():
    health = EndpointHealth("prefill-0", made_offline=True)
    health.peer_accepted("decode-b")   # the interface came up before the worker looked
    for peer in ("decode-a", "decode-c"):
        health.add_peer_failed(peer, UNREACHABLE)
    assert health.broken is None


def test_what_no_restart_mends_is_not_counted():
    """A layout mismatch (the deployment's configuration) on the sender's side, and a sender's
    protocol refusal (unmarked) on the receiver's side."""
    health = EndpointHealth("x", made_offline=True)
    assert health.add_peer_failed("a", LayoutError("layout mismatch")) == "LayoutError: layout mismatch"
    health.registration_refused("c", "this sender already has 64 receivers")
    health.registration_refused("d", "backend 'tcp' but this sender uses 'fake'")
    assert health.broken is None


def test_the_hosts_network_is_an_interface_but_loopback_with_a_carrier(tmp_path):
    net = tmp_path / "net"
    assert host_network_up(net) is None   # no such tree: the kernel does not say
    for name, carrier in (("lo", "1"), ("eth0", "0"), ("eth1", None)):   # eth1: down, carrier unreadable
        (net / name).mkdir(parents=True)
        if carrier is not None:
            (net / name / "carrier").write_text(carrier + "\n")
    assert host_network_up(net) is False
    (net / "eth0" / "carrier").write_text("1\n")
    assert host_network_up(net) is True


# -- on the endpoints --------------------------------------------------------------------------------
def register(receiver: KVReceiver, sender_address: str, room: int) -> str:
    """Open a room towards the sender (which registers the receiver) and wait for its end: the reason."""
    receiver.add_room(room, sender_address, [1], None)
    assert receiver.wait(room, S.SUCCESS, W) == S.FAILED
    reason = receiver.failure_reason(room)
    receiver.release(room)
    return reason or ""


def test_a_sender_made_offline_whose_backend_refuses_a_receiver_is_broken():
    with made_offline():
        snd = KVSender(*pools(1), CFG, name="snd")
    with snd, KVReceiver(*pools(2), CFG, name="rcv-a") as a, KVReceiver(*pools(3), CFG, name="rcv-b") as b:
        snd.backend.unreachable = True  # type: ignore[attr-defined]  # the fake backend's switch
        snd.raise_if_broken()   # healthy until a peer was refused
        assert register(a, snd.bootstrap_address, 1) == (
            "sender lost: registration refused: backend refused the peer: TransferError: fake backend: snd is "
            "unreachable (made while its link was down)")
        assert snd.broken is not None and snd.broken.startswith("it was made while its host had no network")
        assert "rcv-a refused it" in snd.broken
        with pytest.raises(EndpointBrokenError, match="transfer endpoint snd is broken: it was made while"):
            snd.raise_if_broken()
        assert register(b, snd.bootstrap_address, 2).startswith("sender lost: registration refused")
        assert a.broken is None and b.broken is None   # made with the network up: the sender is the broken one


def test_a_sender_made_with_the_network_up_is_not_condemned_by_receivers_made_offline():
    with made_offline():
        a, b = KVReceiver(*pools(2), CFG, name="rcv-a"), KVReceiver(*pools(3), CFG, name="rcv-b")
    with KVSender(*pools(1), CFG, name="snd") as snd, a, b:
        for i, rcv in enumerate((a, b)):
            rcv.backend.unreachable = True  # type: ignore[attr-defined]  # before their metadata goes out
            assert "fake backend: rcv-" in register(rcv, snd.bootstrap_address, i)
        assert snd.broken is None   # two receivers refused: they are the broken ones
        assert a.broken is not None and b.broken is not None


def test_a_receiver_made_offline_that_a_sender_refuses_is_broken_and_the_sender_is_not():
    with made_offline():
        rcv = KVReceiver(*pools(2), CFG, name="rcv")
    with rcv, KVSender(*pools(1), CFG, name="snd-a") as a:
        rcv.backend.unreachable = True  # type: ignore[attr-defined]  # before its metadata goes out
        assert "fake backend: rcv is unreachable" in register(rcv, a.bootstrap_address, 1)
        assert rcv.broken is not None and "snd-a refused it" in rcv.broken
        with pytest.raises(EndpointBrokenError, match="transfer endpoint rcv is broken"):
            rcv.raise_if_broken()
        assert a.broken is None


def test_a_receiver_once_accepted_stays_healthy():
    with made_offline():
        rcv = KVReceiver(*pools(2), CFG, name="rcv")
    with rcv, KVSender(*pools(1), CFG, name="ok") as ok, \
            KVSender(*pools(3), CFG, name="bad-a") as bad_a, KVSender(*pools(4), CFG, name="bad-b") as bad_b:
        ok.add_room(1)
        rcv.add_room(1, ok.bootstrap_address, [1], None)
        assert ok.wait(1, S.WAITING_FOR_INPUT, W) == S.WAITING_FOR_INPUT   # registered
        for s in (bad_a, bad_b):
            s.backend.unreachable = True  # type: ignore[attr-defined]
        register(rcv, bad_a.bootstrap_address, 2)
        register(rcv, bad_b.bootstrap_address, 3)
        assert rcv.broken is None and ok.broken is None
        ok.abort(1)
        assert rcv.wait(1, S.SUCCESS, W) == S.FAILED and ok.wait(1, S.SUCCESS, W) == S.FAILED


def test_layout_mismatches_condemn_neither_side():
    odd = (torch.zeros(8, 3), torch.zeros(2, 4, dtype=torch.int64))
    with made_offline():
        snd, a, b = KVSender(*pools(1), CFG), KVReceiver(*odd, CFG), KVReceiver(*odd, CFG)
    with snd, a, b:
        for i, rcv in enumerate((a, b)):
            assert "registration refused: LayoutError" in register(rcv, snd.bootstrap_address, i)
        assert snd.broken is None and a.broken is None and b.broken is None
