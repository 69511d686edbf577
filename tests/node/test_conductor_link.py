"""ConductorLink's first registration, against a Conductor double that answers late: the caller's
bound decides (attach_conductor waits as long as its launch does), while the link's background calls
keep their own shorter bound. CI once failed a launch whose live Conductor answered after 10 s."""
from __future__ import annotations

import asyncio

import pytest

from raypd.node.conductor_link import ConductorLink
from raypd.protocol.messages import HostInfo
from raypd.protocol.roles import Role

LATE_S = 0.3


class LateConductor:
    """register_node answers after LATE_S and records who registered."""

    def __init__(self):
        self.registered: list[str] = []
        outer = self

        class RegisterNode:
            @staticmethod
            def remote(name, *_):
                async def answer():
                    await asyncio.sleep(LATE_S)
                    outer.registered.append(name)
                    return 0
                return answer()
        self.register_node = RegisterNode()


class Node:
    name, role, host = "link-node", Role.DECODE, HostInfo("node-0", "198.18.0.1", "host-0", 1)

    async def ready(self) -> dict:
        return {"bootstrap_address": "tcp://198.18.0.1:1", "kv_seq": 0}


def test_a_registration_waits_for_its_callers_bound_not_the_background_calls_bound():
    async def run():
        conductor = LateConductor()
        link = ConductorLink(Node(), conductor, None, call_timeout_s=LATE_S / 3)
        with pytest.raises(TimeoutError):
            await link.register()                      # the background's bound: too short for this one
        assert not link.registered
        await link.register(timeout_s=LATE_S * 10)     # attach_conductor's: it is answered
        assert link.registered and conductor.registered[-1] == "link-node"
    asyncio.run(run())
