"""Issue 32's broken sender, caused for real, no Ray: a lab of two hosts (network namespaces), host A's
link cut, a KVSender (nixl, UCX over tcp only, as the lab runs it) started in a process inside A while
cut, so its UCX worker is made with no network interface; the link restored; two receivers in host
B register with it. Its backend refuses both ("Destination is unreachable") and the sender reports
itself broken (kvtransfer/bootstrap/endpoint_health.py: made while its host had no network, then
refused by its backend); the receivers, made with the network up, stay healthy. The control: a sender started in A after the
link is up accepts the same receivers and writes to them. Every process is killed by pid in a
finally, and the lab's context manager removes the namespaces on every exit path. Skipped, with the
reason, where namespaces cannot be made (not root)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from raypd.benchmarks.lab.hosts import Lab, LabSpec, unavailable_reason
from raypd.benchmarks.lab.ray_hosts import NETWORK_ONLY
from raypd.kvtransfer import TransferState as S
from raypd.kvtransfer.data_plane_auth import DataPlaneSecret
from tests.kvtransfer.peer_proc import Peer

pytestmark = [pytest.mark.cluster,  # starts processes inside namespaces
              pytest.mark.skipif(unavailable_reason() is not None, reason=f"no lab here: {unavailable_reason()}")]

W = 15.0
BLOCKS, SLOTS = 8, 2
SECRET = DataPlaneSecret.generate()
# What the cut sender's NIXL agent raised (loadRemoteMD: "UCX endpoint create failed"), as it reaches a receiver.
REFUSAL = "backend refused the peer: nixlBackendError: NIXL_ERR_BACKEND"


def config(host_ip: str) -> dict:
    return dict(backend="nixl", host=host_ip, bootstrap_timeout_s=10.0, wait_timeout_s=10.0, transfer_timeout_s=10.0,
                heartbeat_interval_s=0.25, heartbeat_timeout_s=5.0,
                identity=SECRET.shared_identity())


def until(predicate, what: str, timeout_s: float = W):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def carrier(lab, host) -> bool:
    """Whether the host's eth0 has a carrier now (what UCX looks at when it makes a worker)."""
    return "LOWER_UP" in lab.run(host, ["ip", "-o", "link", "show", "eth0"]).stdout


def test_a_sender_made_while_its_link_was_cut_reports_broken_and_one_made_after_does_not():
    pytest.importorskip("nixl")
    peers: list[Peer] = []

    def start(host, role: str, seed: int) -> Peer:
        peer = Peer.start_in(lab, host, role, config(host.ip), seed, BLOCKS, SLOTS, NETWORK_ONLY)
        peers.append(peer)
        return peer

    with Lab(LabSpec(hosts_per_rack=(2,))) as lab:
        a, b = lab.hosts
        try:
            lab.cut(a)
            until(lambda: not carrier(lab, a), "host A's eth0 to lose its carrier")
            cut_sender = start(a, "sender", 1)   # its UCX worker is made now, with no carrier on eth0
            lab.restore(a)
            until(lambda: carrier(lab, a), "host A's eth0 to get its carrier back")
            receivers = [start(b, "receiver", seed) for seed in (2, 3)]
            for room, rcv in enumerate(receivers):
                rcv.call("add_room", room, cut_sender.info["address"], [0, 1], None)
            for room, rcv in enumerate(receivers):
                assert rcv.call("wait", room, S.SUCCESS, W, timeout=W + 5) == S.FAILED
                reason = rcv.call("failure_reason", room)
                assert reason == f"sender lost: registration refused: {REFUSAL}", reason   # issue 32's error
                rcv.call("release", room)
            broken = until(lambda: cut_sender.call("broken"), "the cut sender to report broken")
            first = receivers[0].info["name"]
            assert broken == ("it was made while its host had no network (no interface but loopback had a "
                              f"carrier), and its backend has reached no peer since: {first} refused it: {REFUSAL}"), \
                broken

            sender = start(a, "sender", 4)   # the control: made with the link up
            for room, rcv in enumerate(receivers, start=10):
                sender.call("add_room", room)
                rcv.call("add_room", room, sender.info["address"], [room - 10], 0)
                assert sender.call("wait", room, S.WAITING_FOR_INPUT, W, timeout=W + 5) == S.WAITING_FOR_INPUT
                sender.call("send", room, np.array([3]), 1)
                assert rcv.call("wait", room, S.SUCCESS, W, timeout=W + 5) == S.SUCCESS
            assert sender.call("broken") is None and cut_sender.call("broken") == broken
            assert [rcv.call("broken") for rcv in receivers] == [None, None]  # made with the network up
        finally:
            for peer in peers:   # by pid; the lab's close() would find them too
                peer.kill()
                peer.conn.close()
