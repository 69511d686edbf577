"""NodeDrain: one node taken out of the pool without losing a request.

    RETIRING ─Conductor routes it nothing new, supervisor shows it DRAINING─> DRAINING
        │ RetireRefused (the last node of its kind)                  │ idle at two checks confirm_s apart
        v                                                            v
      REFUSED                                                     REMOVED (shut down, killed, forgotten)
    DRAINING ─drain_timeout_s without going idle, or call_off()─> CALLED_OFF (routed again)
    DRAINING ─its actor failed (restarting, dead, unresponsive)─> REMOVED (killed: it cannot be trusted idle)

Idle means check_idle() shows no request, reservation or stream on the node. Two checks confirm_s
apart, because a request the Conductor routed just before the retirement, or an ingress replica
whose membership view is up to half a second old, may still be on its way to the node; a request
that arrives after the second check would find the node gone and be retried elsewhere by the
ingress (a retry, not a loss). The drain never aborts a request: a node that does not go idle in
drain_timeout_s is routed again instead (the caller may try another later).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import Enum
from typing import Any

import ray

from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.serve.supervisor import NodeSupervisor

log = logging.getLogger(__name__)
CALL_TIMEOUT_S = 10.0


class DrainPhase(int, Enum):
    RETIRING = 0
    DRAINING = 1
    REFUSED = 2      # ended: the Conductor keeps the node (the last of its kind)
    CALLED_OFF = 3   # ended: the node serves again
    REMOVED = 4      # ended: the node is gone from Ray, the Conductor and the membership

    @property
    def ended(self) -> bool:
        return self >= DrainPhase.REFUSED


class NodeDrain:
    def __init__(self, node: NodeHandle, supervisor: NodeSupervisor, conductor: Any,
                 forget: Callable[[NodeHandle], None], *, drain_timeout_s: float = 300.0,
                 poll_s: float = 1.0, confirm_s: float = 2.0, kill: Callable[[Any], None] = ray.kill):
        """`forget`: drop the node from its launcher's list (NodeCluster.remove) once removed.
        `kill`: ends its actor for good (ray.kill: no restart)."""
        self.node = node
        self.kill = kill
        self.supervisor = supervisor
        self.conductor = conductor
        self.forget = forget
        self.drain_timeout_s = drain_timeout_s
        self.poll_s = poll_s
        self.confirm_s = confirm_s
        self.phase = DrainPhase.RETIRING
        self.reason = ""
        self._call_off = asyncio.Event()

    def call_off(self) -> None:
        """Keep the node after all (the pool is short again): it is routed again at once."""
        self._call_off.set()

    async def run(self) -> DrainPhase:
        name = self.node.name
        if self.conductor is not None:
            try:
                await asyncio.wait_for(self.conductor.retire_node.remote(name), CALL_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - RetireRefused, or the Conductor is away: keep the node
                return self._end(DrainPhase.REFUSED, f"the Conductor did not retire it: {e}")
        self.supervisor.drain(name)
        self.phase = DrainPhase.DRAINING
        log.info("draining node %s to remove it", name)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.drain_timeout_s
        idle_since: float | None = None
        while loop.time() < give_up and not self._call_off.is_set():
            member = self.supervisor.membership().by_name.get(name)
            if member is None or not member.serving:
                return await self._remove(f"it failed while draining ({member.state.value if member else 'gone'})")
            held = await self._held()
            if held is None or any(held.values()):
                idle_since = None
            elif idle_since is None:
                idle_since = loop.time()
            elif loop.time() - idle_since >= self.confirm_s:
                return await self._remove("drained: idle")
            try:
                await asyncio.wait_for(self._call_off.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass
        why = "called off" if self._call_off.is_set() else f"still busy after {self.drain_timeout_s:g} s"
        await self._undrain()
        return self._end(DrainPhase.CALLED_OFF, why)

    async def _held(self) -> dict | None:
        try:
            return await asyncio.wait_for(self.node.actor.check_idle.remote(), CALL_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - the supervisor's probes decide whether it failed
            log.warning("draining %s: check_idle failed: %s", self.node.name, e)
            return None

    async def _undrain(self) -> None:
        self.supervisor.undrain(self.node.name)
        if self.conductor is not None:
            try:
                await asyncio.wait_for(self.conductor.retire_node.remote(self.node.name, False), CALL_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - the node re-registers if the Conductor restarts
                log.warning("could not route %s again: %s", self.node.name, e)

    async def _remove(self, why: str) -> DrainPhase:
        name, actor = self.node.name, self.node.actor
        try:
            await asyncio.wait_for(actor.shutdown.remote(), CALL_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - it is killed next either way
            log.info("node %s did not shut down cleanly: %s", name, e)
        try:
            self.kill(actor)   # ray.kill's no_restart: Ray must not bring it back
        except Exception as e:  # noqa: BLE001 - already gone
            log.info("killing node %s: %s", name, e)
        if self.conductor is not None:
            try:
                await asyncio.wait_for(self.conductor.mark_dead.remote(name, "removed from the pool"), CALL_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - its missed heartbeats do it too
                log.info("telling the Conductor %s left failed: %s", name, e)
        self.supervisor.remove(name)
        self.forget(self.node)
        return self._end(DrainPhase.REMOVED, why)

    def _end(self, phase: DrainPhase, reason: str) -> DrainPhase:
        self.phase, self.reason = phase, reason
        log.info("drain of node %s: %s (%s)", self.node.name, phase.name.lower(), reason)
        return phase
