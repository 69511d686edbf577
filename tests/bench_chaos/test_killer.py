"""The kill loop over a fake cluster: each planned kind done to a live target or recorded with its
reason, never a SIGKILL to a pid the cluster check refused, a recovery watch per kill done."""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import pytest

from raypd.benchmarks.chaos.killer import Killer
from raypd.benchmarks.chaos.ray_cluster import (
    KillRefused,
    RayCluster,
    Target,
    processes_left,
    ray_address_from_log,
    targets_from_actor_states,
    targets_from_actor_table,
)
from raypd.benchmarks.chaos.schedule import KillSchedule


class RayActorError(Exception):
    pass


class GetTimeoutError(Exception):
    pass


class FakeRay:
    class exceptions:
        RayActorError = RayActorError
        GetTimeoutError = GetTimeoutError

    def __init__(self):
        self.calls: list[tuple] = []

    def kill(self, handle, no_restart=True):
        self.calls.append(("kill", handle.name, no_restart))

    def get(self, ref, timeout=None):
        self.calls.append(("get", ref, timeout))
        if ref == "dies":
            raise RayActorError("the actor died")
        if ref == "hangs":
            raise GetTimeoutError()
        return None


class Method:
    def __init__(self, result: str):
        self.result = result

    def remote(self) -> str:
        return self.result


class Handle:
    def __init__(self, name: str, crash: str | None):
        self.name = name
        if crash is not None:
            self.crash_engine = Method(crash)


class FakeCluster:
    def __init__(self, targets: list[Target], crash: str | None = None):
        self.ray = FakeRay()
        self._targets = targets
        self.crash = crash

    def targets(self) -> list[Target]:
        return list(self._targets)

    def handle(self, t: Target) -> Handle:
        return Handle(t.name, self.crash)

    def worker_process(self, pid: int):
        raise KillRefused(f"pid {pid} is not a descendant of the server")


class FakeMonitor:
    def __init__(self, live: set[str] | None, recovers_after_s: float = 0.0):
        self.live = live
        self.recovers_after_s = recovers_after_s
        self.watched: list[tuple] = []

    async def read(self):
        return None

    def live_names(self, targets):
        return self.live

    def incarnation(self, name, role):
        return 0

    async def recovery_s(self, name, role, before, killed_at, deadline, probe):
        self.watched.append((name, before))
        await asyncio.sleep(self.recovers_after_s)
        return 1.5


TARGETS = [Target("raypd-conductor", "conductor", "serve", 11, "Conductor"),
           Target("raypd-decode-0", "decode", "serve", 12, "DecodeNode"),
           Target("raypd-decode-1", "decode", "serve", 13, "DecodeNode")]


async def _probe() -> bool:
    return True


def _run(cluster, monitor, roles=("decode", "conductor"), duration=0.35, every=0.1, spare_last_node=False):
    schedule = KillSchedule(duration, every, roles, seed=1, spare_last_node=spare_last_node)
    killer = Killer(schedule, cluster, monitor, _probe, time.monotonic() + 5, every)

    async def go():
        await killer.run(time.monotonic())
        return await killer.recovery_s()
    return killer, asyncio.run(go())


def test_each_kind_done_or_recorded_with_its_reason():
    cluster = FakeCluster(TARGETS, crash=None)
    monitor = FakeMonitor(live=None)  # no readiness: every ALIVE actor counts as live
    killer, recovery = _run(cluster, monitor)
    assert [k.kind for k in killer.kills] == ["ray_kill"]
    (kill,) = killer.kills
    assert ("kill", kill.target, False) in cluster.ray.calls  # restart allowed
    assert recovery == [1.5] and monitor.watched == [(kill.target, 0)]
    assert [f.kind for f in killer.failures] == ["sigkill", "engine_crash"]
    assert "not a descendant" in killer.failures[0].error  # refused before any signal
    assert killer.failures[1].error.startswith("DecodeNode has no crash_engine()")


def test_an_engine_that_dies_answering_is_a_kill():
    cluster = FakeCluster(TARGETS, crash="dies")
    killer, _ = _run(cluster, FakeMonitor(live=None), roles=("decode",), duration=0.35)
    assert [k.kind for k in killer.kills] == ["ray_kill", "engine_crash"]
    assert killer.kills[1].role == "decode"
    assert [f.kind for f in killer.failures] == ["sigkill"]


def test_a_crash_call_that_hangs_is_not_a_kill():
    cluster = FakeCluster(TARGETS, crash="hangs")
    killer, _ = _run(cluster, FakeMonitor(live=None), roles=("decode",), duration=0.35)
    assert "did not answer" in killer.failures[-1].error and killer.failures[-1].kind == "engine_crash"


def test_no_live_target_is_a_failure_not_a_kill():
    cluster = FakeCluster(TARGETS)
    killer, recovery = _run(cluster, FakeMonitor(live={"raypd-decode-0"}), roles=("decode",), duration=0.15,
                            spare_last_node=True)
    assert killer.kills == [] and recovery == []
    assert [(f.kind, f.target, f.error) for f in killer.failures] == [("ray_kill", None, "no eligible target")]


def test_a_member_still_recovering_is_not_killed_again():
    cluster = FakeCluster(TARGETS, crash="dies")
    monitor = FakeMonitor(live=None, recovers_after_s=0.5)  # Ray still says ALIVE: its view lags too
    killer, recovery = _run(cluster, monitor, roles=("decode",), duration=0.35, spare_last_node=True)
    # The first kill takes one decode node; while it recovers the other is the last live decode node.
    assert [k.kind for k in killer.kills] == ["ray_kill"] and recovery == [1.5]
    assert [(f.kind, f.error) for f in killer.failures] == [("sigkill", "no eligible target"),
                                                            ("engine_crash", "no eligible target")]


def test_actor_states_to_targets():
    states = [{"class_name": "DecodeNode", "name": "raypd-decode-0", "ray_namespace": "serve", "pid": 7,
               "state": "ALIVE"},
              {"class_name": "ServeReplica:raypd:NodePool", "name": "x", "ray_namespace": "serve", "pid": 8},
              {"class_name": "Conductor", "name": "raypd-conductor", "ray_namespace": "serve", "pid": 9}]
    assert targets_from_actor_states(states) == [Target("raypd-conductor", "conductor", "serve", 9, "Conductor"),
                                                 Target("raypd-decode-0", "decode", "serve", 7, "DecodeNode")]


def test_the_ray_address_comes_from_the_server_log():
    log = "raypd serve: nodes: a, b\nraypd serve: Ray cluster: 10.0.0.5:6379\nraypd serve: ready; Ctrl-C\n"
    assert ray_address_from_log(log) == "10.0.0.5:6379"
    assert ray_address_from_log("raypd serve: starting 2 node(s)") is None


def test_the_worker_check_refuses_what_is_not_the_servers_worker():
    # "The server" is this process's parent: this process is under it and started after it, but it is no Ray worker.
    cluster = RayCluster("127.0.0.1:1", server_pid=os.getppid())
    with pytest.raises(KillRefused, match="not a Ray worker"):
        cluster.worker_process(os.getpid())
    mine = RayCluster("127.0.0.1:1", server_pid=os.getpid())
    with pytest.raises(KillRefused, match="not a descendant"):
        mine.worker_process(os.getppid())
    with pytest.raises(KillRefused, match="NoSuchProcess"):
        mine.worker_process(2 ** 22 + 12345)
    assert processes_left(["no-such-address-7f3a:1", ""]) == []


def test_gcs_actor_table_to_targets():
    table = {"a1": {"ActorClassName": "DecodeNode", "Name": "raypd-decode-0", "State": "ALIVE", "Pid": 7,
                    "Address": {"NodeID": "n2"}},
             "a2": {"ActorClassName": "DecodeNode", "Name": "raypd-decode-1", "State": "DEAD", "Pid": 8},
             "a3": {"ActorClassName": "Conductor", "Name": "raypd-conductor", "State": "ALIVE", "Pid": 9,
                    "Address": {"NodeID": "n0"}}}
    assert targets_from_actor_table(table, {"raypd-decode-0": "serve"}) == [
        Target("raypd-conductor", "conductor", "", 9, "Conductor", "n0"),
        Target("raypd-decode-0", "decode", "serve", 7, "DecodeNode", "n2")]


@dataclass(frozen=True)
class LabHost:
    name: str
    role: str
    ip: str


class FakeLab:
    hosts = (LabHost("h1", "prefill", "ip1"), LabHost("h2", "decode", "ip2"), LabHost("h3", "prefill", "ip3"),
             LabHost("h4", "decode", "ip4"))

    def __init__(self):
        self.calls: list[tuple[str, str, float]] = []

    def kill_host(self, name):
        self.calls.append(("kill_host", name, time.monotonic()))
        return 5

    def cut(self, name):
        self.calls.append(("cut", name, time.monotonic()))

    def restore(self, name):
        self.calls.append(("restore", name, time.monotonic()))


class HostCluster(FakeCluster):
    def targets(self):
        return [Target("raypd-decode-0", "decode", "serve", 12, "DecodeNode", "n2"),
                Target("raypd-decode-1", "decode", "serve", 13, "DecodeNode", "n4"),
                Target("raypd-conductor", "conductor", "serve", 11, "Conductor", "n2")]

    def node_ips(self):
        return {"n2": "ip2", "n4": "ip4"}

    def routes(self, targets):
        return {"r-0": ("raypd-prefill-0", "raypd-decode-0", 1.0)}, ""


class HostMonitor(FakeMonitor):
    async def nodes_back_s(self, names, since, killed_at, deadline, probe, newer):
        self.watched.append((dict(names), newer))
        return 2.0


def test_a_host_kill_then_a_partition_restored_after_its_seconds():
    lab, monitor = FakeLab(), HostMonitor(live=None)
    schedule = KillSchedule(0.25, 0.1, ["host", "partition"], seed=0)
    killer = Killer(schedule, HostCluster(TARGETS), monitor, _probe, time.monotonic() + 5, 0.1, lab=lab,
                    partition_s=0.3)

    async def go():
        await killer.run(time.monotonic())
        return await killer.recovery_s()
    recovery = asyncio.run(go())
    (kill_op, lost, _), (cut_op, cut, cut_at), (restore_op, restored, restored_at) = lab.calls
    assert (kill_op, cut_op, restore_op) == ("kill_host", "cut", "restore") and cut == restored != lost
    assert restored_at - cut_at >= 0.3 and recovery == [2.0, 2.0]
    assert [k.kind for k in killer.kills] == ["host_kill", "partition"] and killer.failures == []
    fault = killer.host_faults[0]
    assert fault.processes_killed == 5 and fault.routes == {"r-0": ("raypd-prefill-0", "raypd-decode-0", 1.0)}
    assert fault.nodes == ({"raypd-decode-0": 0} if lost == "h2" else {"raypd-decode-1": 0} if lost == "h4" else {})
    assert killer.host_faults[1].restored_at_s is not None and killer.cut_off == set() and killer.lost == {lost}
    assert [newer for _, newer in monitor.watched] == [True, False]
