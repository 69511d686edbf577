"""NodeSupervisor: the node pool's watch over its node actors and the Conductor.

Every probe_interval_s it calls ready() and published_load() on each node and status() on the
Conductor (one watch loop each, every call bounded by probe_timeout_s), and keeps a Membership (client/membership.py)
that ingress replicas fetch. A node answers both off its engine thread, so a long engine step never
delays a probe; a step that never ends shows in the load as stalled_s. What it does on what it sees:
  - a call fails or times out on a LIVE node (the process is gone or frozen), or its engine turn has
    run longer than stall_timeout_s (the engine is hung): the node leaves routing now (state
    RESTARTING, UNRESPONSIVE or DEAD, from Ray's error; UNRESPONSIVE for a stall) and the Conductor
    is told (mark_dead) rather than left to notice by missed heartbeats; it is LIVE again once it
    answers and its engine turns;
  - ready() answers with a new instance id: Ray restarted the actor (the node pool creates nodes
    with max_restarts); the handle is refreshed (a new bootstrap address) and the node is LIVE with
    incarnation + 1 at once, so routers without the Conductor can use it; its attachment to the
    Conductor runs in the background, retried until it takes (the Conductor may be away too);
  - the Conductor answers with a new instance id: it restarted; the nodes re-register by themselves
    (node/conductor_link.py), nothing to do here but count it.
Ray restarts an actor at once; a node that keeps crashing is bounded by max_restarts, then DEAD.

The pool scaler (cluster/autoscale/pool_scaler.py) changes the set: add() starts watching new
nodes, drain() keeps a node DRAINING (a probe that answers leaves it so, not LIVE) until
undrain() or remove(), which stops watching it and drops it from the membership.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import ray

from raypd.cluster.client.fire import fire
from raypd.cluster.client.membership import Member, Membership, MemberState
from raypd.cluster.client.node_handles import NodeHandle
from raypd.metrics.task_events import untracked

log = logging.getLogger(__name__)
MARK_DEAD_S = 10  # best effort: the Conductor's heartbeat timeout is the backstop


class EngineStalled(RuntimeError):
    """The node answers, but its engine's current turn has run longer than the stall timeout."""


def state_after(error: BaseException) -> MemberState:
    """What a failed probe says about the actor."""
    if isinstance(error, (asyncio.TimeoutError, EngineStalled)):
        return MemberState.UNRESPONSIVE
    if isinstance(error, ray.exceptions.ActorUnavailableError):
        return MemberState.RESTARTING
    if isinstance(error, ray.exceptions.ActorDiedError):
        # Also raised for a call that was running when the actor died: the next probe (queued until
        # the restart, or failing at once when the restarts are used up) tells which it was.
        return MemberState.DEAD
    return MemberState.RESTARTING  # NodeCrashedError and the like: the node is restarting itself


class NodeSupervisor:
    def __init__(self, nodes: list[NodeHandle], conductor: Any = None, probe_interval_s: float = 1.0,
                 probe_timeout_s: float = 5.0, attach_timeout_s: float = 30.0, stall_timeout_s: float = 60.0,
                 incarnations: dict[str, int] | None = None, conductor_incarnation: int = 0):
        """`incarnations`, `conductor_incarnation`: where the count goes on from for actors this
        pool adopted (their restarts so far); 0 for the rest."""
        self.conductor = conductor
        self.probe_interval_s = probe_interval_s
        self.probe_timeout_s = probe_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.attach_timeout_s = attach_timeout_s
        known = incarnations or {}
        self._members = {n.name: Member(n, incarnation=known.get(n.name, 0), restarts=known.get(n.name, 0))
                         for n in nodes}
        self._instances: dict[str, str] = {}   # node name -> instance id of the incarnation we know
        self._conductor_state = MemberState.LIVE if conductor is not None else MemberState.NONE
        self._conductor_instance = ""
        self._conductor_incarnation = conductor_incarnation
        self._version = 0
        self._tasks: dict[str | None, asyncio.Task] = {}   # node name (None: the Conductor) -> its watch
        self._draining: set[str] = set()   # nodes the pool drains: DRAINING while their probes answer
        self.autoscale_status: dict | None = None   # the pool scaler's, shown in the membership (/health)
        self._snapshot = self._build()
        self._attaching: dict[str, asyncio.Task] = {}  # node name -> its new incarnation's attachment

    # -- for the node pool ------------------------------------------------------------------------
    def start(self) -> None:
        """One watch loop per node and one for the Conductor: a slow probe delays no other."""
        loop = asyncio.get_running_loop()
        self._tasks = {name: loop.create_task(self._watch(name)) for name in self._members}
        if self.conductor is not None:
            self._tasks[None] = loop.create_task(self._watch(None))

    def stop(self) -> None:
        for task in [*self._tasks.values(), *self._attaching.values()]:
            task.cancel()

    def add(self, nodes: list[NodeHandle]) -> None:
        """New nodes (ready, attached to the Conductor): LIVE, and watched from now on."""
        loop = asyncio.get_running_loop()
        for node in nodes:
            self._members[node.name] = Member(node)
            self._tasks[node.name] = loop.create_task(self._watch(node.name))
        self._bump()

    def drain(self, name: str) -> None:
        """Route `name` nothing new (DRAINING) while what it holds finishes."""
        self._draining.add(name)
        member = self._members[name]
        if member.state is MemberState.LIVE:
            self._set(replace(member, state=MemberState.DRAINING), changed=None)

    def undrain(self, name: str) -> None:
        """Call a drain off: LIVE again (if its probes still answer)."""
        self._draining.discard(name)
        member = self._members.get(name)
        if member is not None and member.state is MemberState.DRAINING:
            self._set(replace(member, state=MemberState.LIVE), changed=None)

    def remove(self, name: str) -> None:
        """Stop watching `name` and drop it from the membership (it was drained, or is dead for good)."""
        for task in (self._tasks.pop(name, None), self._attaching.pop(name, None)):
            if task is not None:
                task.cancel()
        self._draining.discard(name)
        self._instances.pop(name, None)
        if self._members.pop(name, None) is not None:
            self._bump()

    def publish(self, autoscale_status: dict) -> None:
        """The pool scaler's status, for /health (no new version: nothing changed in the nodes)."""
        self.autoscale_status = autoscale_status
        self._snapshot = self._build()

    def membership(self) -> Membership:
        return self._snapshot

    async def probe_round(self) -> Membership:
        """Probe every node and the Conductor once (the loop does this every probe_interval_s)."""
        await asyncio.gather(*(self._probe(m) for m in list(self._members.values())), self._probe_conductor())
        return self._snapshot

    # -- internals --------------------------------------------------------------------------------
    async def _watch(self, name: str | None) -> None:
        """Probe one node (None: the Conductor) every probe_interval_s, for good."""
        while True:
            try:
                await (self._probe(self._members[name]) if name is not None else self._probe_conductor())
            except Exception:  # noqa: BLE001 - the supervisor must outlive any one bad probe
                log.exception("probing %s failed", name or "the Conductor")
            await asyncio.sleep(self.probe_interval_s)

    async def _probe(self, member: Member) -> None:
        actor = member.node.actor
        try:
            info = await asyncio.wait_for(untracked(actor.ready).remote(), self.probe_timeout_s)
            load = await asyncio.wait_for(untracked(actor.published_load).remote(), self.probe_timeout_s)
            if load.stalled_s > self.stall_timeout_s:
                raise EngineStalled(f"its engine step has run for {load.stalled_s:.0f} s "
                                    f"(stall timeout {self.stall_timeout_s:.0f} s)")
        except Exception as e:  # noqa: BLE001 - any failure takes the node out of routing
            self._failed(member, e)
            return
        instance = info.get("instance_id", "")
        known = self._instances.setdefault(member.name, instance)
        if instance != known:
            try:
                await self._restarted(member, info, instance)
            except Exception as e:  # noqa: BLE001 - as a failed probe
                self._failed(member, e)
            return
        state = MemberState.DRAINING if member.name in self._draining else MemberState.LIVE
        self._set(replace(member, state=state, load=load, reason=""), changed=member.state)

    async def _restarted(self, member: Member, info: dict, instance: str) -> None:
        node = replace(member.node, host=info["host"], num_blocks=info["num_blocks"],
                       bootstrap_address=info.get("bootstrap_address", ""),
                       public_key=info.get("public_key", member.node.public_key))
        # Ray built the new incarnation from the old constructor arguments: its allow-list may predate
        # nodes added since. It takes the whole list before anyone routes to it (a failure here is the
        # probe's: the next one retries, since the instance is still new to us).
        keys = {m.name: m.node.public_key for m in self._members.values() if m.node.public_key}
        await asyncio.wait_for(untracked(node.actor.admit_peers).remote(keys), self.probe_timeout_s)
        self._instances[member.name] = instance
        log.warning("node %s is back (incarnation %d)", node.name, member.incarnation + 1)
        self._set(Member(node, MemberState.LIVE, member.incarnation + 1, member.restarts + 1), changed=None)
        if self.conductor is not None:
            if (previous := self._attaching.pop(node.name, None)) is not None:
                previous.cancel()  # an earlier incarnation's attachment: that actor is gone
            self._attaching[node.name] = asyncio.get_running_loop().create_task(self._attach(node, instance))

    async def _attach(self, node: NodeHandle, instance: str) -> None:
        """Attach this incarnation to the Conductor, retrying every probe interval until it takes,
        while it is still the node's current incarnation and not dead."""
        while self._instances.get(node.name) == instance and self._members[node.name].state is not MemberState.DEAD:
            try:
                await asyncio.wait_for(node.actor.attach_conductor.remote(self.conductor), self.attach_timeout_s)
                return
            except Exception as e:  # noqa: BLE001 - the Conductor may be away: the node serves meanwhile
                log.warning("attaching restarted node %s to the Conductor failed (retrying): %s", node.name, e)
            await asyncio.sleep(self.probe_interval_s)

    def _failed(self, member: Member, error: BaseException) -> None:
        state = state_after(error)
        if state is MemberState.UNRESPONSIVE and member.state is MemberState.RESTARTING:
            return  # calls wait for a restarting actor: a slow model load times out the probe
        if state is member.state:
            return
        reason = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        if member.serving:
            log.warning("node %s left routing (%s): %s", member.name, state.value, reason)
            if self.conductor is not None:
                fire(self.conductor.mark_dead.remote(member.name, f"node pool: {reason}"), MARK_DEAD_S)
        self._set(replace(member, state=state, reason=reason), changed=None)

    async def _probe_conductor(self) -> None:
        if self.conductor is None:
            return
        try:
            status = await asyncio.wait_for(untracked(self.conductor.status).remote(), self.probe_timeout_s)
        except Exception as e:  # noqa: BLE001 - the ingress routes without it meanwhile
            state = state_after(e)
            if state is MemberState.DEAD:  # the Conductor restarts without bound: a died call means restarting
                state = MemberState.RESTARTING
            if state is not self._conductor_state:
                log.warning("the Conductor is %s: %s", state.value, e)
                self._conductor_state = state
                self._bump()
            return
        instance = status.get("instance_id", "")
        if not self._conductor_instance:
            self._conductor_instance = instance
        elif instance != self._conductor_instance:
            self._conductor_instance = instance
            self._conductor_incarnation += 1
            log.warning("the Conductor is back (incarnation %d)", self._conductor_incarnation)
            self._conductor_state = MemberState.LIVE
            self._bump()
        if self._conductor_state is not MemberState.LIVE:
            self._conductor_state = MemberState.LIVE
            self._bump()

    def _set(self, member: Member, changed: MemberState | None) -> None:
        """Store `member`; a new version when its state changed (changed: its old state, None = yes)
        - load updates alone refresh the snapshot without a new version."""
        if member.name not in self._members:
            return   # removed while its probe was under way
        self._members[member.name] = member
        if changed is None or changed is not member.state:
            self._version += 1
        self._snapshot = self._build()

    def _bump(self) -> None:
        self._version += 1
        self._snapshot = self._build()

    def _build(self) -> Membership:
        return Membership(self._version, tuple(self._members.values()), self.conductor, self._conductor_state,
                          self._conductor_incarnation, self.autoscale_status)
