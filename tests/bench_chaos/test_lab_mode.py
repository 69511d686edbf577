"""The pipe between the run inside the lab's head host and the lab's owner: each host fault is one
asked line and one answer; the head host (not among the hosts) is never hit; a failed fault reaches
the run as KillFailed with the lab's reason. No namespace is made: the lab is a fake."""
from __future__ import annotations

import json
import os
import threading

import pytest

from raypd.benchmarks.chaos.killer import KillFailed
from raypd.benchmarks.chaos.lab_mode import LabFaults, LabHost, LabRun, _do


class FakeLab:
    def __init__(self):
        self.done: list[tuple[str, str]] = []

    def kill_host(self, host):
        self.done.append(("kill_host", host.name))
        return [101, 102]

    def cut(self, host):
        if host.name == "h3":
            raise RuntimeError("`ip link set rl-h3 down` exited with 1")
        self.done.append(("cut", host.name))

    def restore(self, host):
        self.done.append(("restore", host.name))


def test_faults_go_through_the_pipe_and_only_to_non_head_hosts():
    hosts = {name: LabHost(name, "decode", 0, f"ip-{name}", f"ns-{name}") for name in ("h2", "h3")}
    ask_r, ask_w = os.pipe()
    answer_r, answer_w = os.pipe()
    lab, cut = FakeLab(), set()

    def owner():
        with os.fdopen(ask_r) as asks, os.fdopen(answer_w, "w", buffering=1) as answers:
            for line in asks:
                answers.write(json.dumps(_do(lab, hosts, cut, json.loads(line))) + "\n")

    thread = threading.Thread(target=owner, daemon=True)
    thread.start()
    faults = LabFaults(LabRun("a:6379", "ip-h0", tuple(hosts.values()), ask_w, answer_r))
    assert faults.kill_host("h2") == 2
    faults.cut("h2")
    assert cut == {"h2"}
    faults.restore("h2")
    assert cut == set() and lab.done == [("kill_host", "h2"), ("cut", "h2"), ("restore", "h2")]
    with pytest.raises(KillFailed, match="exited with 1"):
        faults.cut("h3")
    with pytest.raises(KillFailed, match="the head host is never a target"):
        faults.kill_host("h0")
    faults._ask.close()
    thread.join(5)
    assert not thread.is_alive()
