"""The Conductor Ray actor: ConductorCore plus what needs the cluster - node handles, a background
loop for heartbeats and re-syncs, and node-to-node prefix copies.

Start it with start_conductor() (named, optionally detached); nodes find it by name.

Node-side contract (what this actor calls on a node's handle; all return promptly):
  kv_snapshot() -> (last_seq: int, events: list[BlockStored])
      Every block the node's prefix cache holds now, as BlockStored events rooted at ROOT_HASH or
      at a block listed before them, and the sequence number of the last KV event those reflect.
      Called after the index saw a gap or a backwards sequence from that node.
  export_prefix(token_ids: list[int], room: int, target_node: str) -> PrefillResult
      Source side of a copy: lock the cached blocks covering token_ids, open kvtransfer room `room`
      as a sender (like a PD request in the bootstrap queue, with no compute), write the blocks when
      the target's destination arrives, unlock. ok=False with an error if the prefix is not (or no
      longer) fully cached, or the transfer fails.
  import_prefix(token_ids: list[int], room: int, source_bootstrap_address: str) -> PrefillResult
      Target side: reserve blocks for the part of token_ids not cached locally, register them as
      the destination of `room` with the source's bootstrap server, wait for the write, insert the
      blocks into the radix cache (which emits BlockStored to the Conductor); num_cached_tokens =
      tokens now cached. On any failure free the reserved blocks and return ok=False.
  abort_migration(room: int) -> None
      Best effort, after a timeout: end the room on this side, freeing or unlocking what it holds.
A failed copy leaves both nodes as they were; the index learns only from the target's own events.

Nodes call: register_node (with their own handle and kvtransfer bootstrap address), heartbeat,
report_load (a heartbeat too; LoadReport.timestamp in time.time()), report_kv_events, and
report_delivered(request_id, num_cached_tokens) once a request's prefill has run.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import time
from collections.abc import Sequence
from typing import Any

from raypd.conductor.config import ConductorConfig
from raypd.conductor.core import ConductorCore
from raypd.conductor.decision import RouteDecision
from raypd.conductor.errors import UnknownNodeError
from raypd.conductor.metrics import ConductorMetrics
from raypd.conductor.planners.migration import MigrationPlan
from raypd.conductor.topology import Topology
from raypd.protocol.messages import HostInfo, KVEventBatch, LoadReport
from raypd.protocol.roles import Role
from raypd.protocol.sampling_params import DEFAULT_PRIORITY

log = logging.getLogger(__name__)

DEFAULT_NAME = "raypd-conductor"


class Conductor:
    """Async Ray actor; every method runs on one event loop, so the core needs no locks."""

    def __init__(self, config: ConductorConfig | None = None, topology: Topology | None = None,
                 topology_yaml: str | None = None):
        self.config = config or ConductorConfig()
        if topology is None:
            topology = Topology.from_yaml(topology_yaml) if topology_yaml else topology_from_ray()
        self.core = ConductorCore(self.config, topology, clock=time.time, metrics=ConductorMetrics())
        self._loop_task: asyncio.Task | None = None
        self._resyncing: set[str] = set()
        self._copies: set[asyncio.Task] = set()
        self.copies_ok = self.copies_failed = 0
        self.instance_id = secrets.token_hex(8)  # new for every incarnation (Ray restarts this actor)

    # -- node-facing --------------------------------------------------------------------------
    async def register_node(self, name: str, role: Role | str, host: HostInfo, handle: Any = None,
                            bootstrap_address: str = "", kv_seq: int = 0, duty: str = "") -> int:
        """`kv_seq`: the node's last KV event so far. Above 0 the node already caches blocks this
        actor never saw (it restarted and the nodes outlived it, or the node re-registers after a
        Conductor outage): its cache is re-read from a snapshot at once rather than at its next event.
        `duty`: a flex node's current duty."""
        self._ensure_loop()
        slot = self.core.register_node(name, role, host, handle, bootstrap_address, duty).slot
        if kv_seq > 0 and handle is not None:
            self._start_resync(name)
        if (restored := self.core.duty_to_restore(name)) is not None:   # Ray restarted it with its launch duty
            log.info("flex node %s came back in its launch duty: ordering it back to %s", name, restored)
            self._spawn(self._tell_duty(name, restored.value))
        return slot

    async def heartbeat(self, name: str) -> None:
        self.core.heartbeat(name)

    async def report_load(self, report: LoadReport) -> None:
        self.core.report_load(report)

    async def report_kv_events(self, batch: KVEventBatch) -> bool:
        """Returns False when the node's events stopped applying and a re-sync was started."""
        self._ensure_loop()
        res = self.core.report_kv_events(batch)
        if res.needs_resync:
            self._start_resync(batch.node_name)
        return not res.needs_resync

    async def report_delivered(self, request_id: str, num_cached_tokens: int) -> None:
        self.core.report_delivered(request_id, num_cached_tokens)

    async def mark_dead(self, name: str, reason: str = "marked dead") -> bool:
        return self.core.mark_dead(name, reason)

    async def retire_node(self, name: str, retiring: bool = True) -> None:
        """The node pool drains `name` to remove it: route it nothing new (False: call that off).
        RetireRefused when it is the last node of its kind (ConductorCore.retire_node)."""
        self.core.retire_node(name, retiring)

    # -- caller-facing ------------------------------------------------------------------------
    async def route(self, request_id: str, prompt_token_ids: Sequence[int],
                    block_hashes: dict[int, list[int]] | None = None,
                    exclude: Sequence[str] = (), priority: int = DEFAULT_PRIORITY) -> RouteDecision:
        """The decision for one request; raises AdmissionRejected / NoCandidateError (Ray re-raises
        them as instances of the same classes). A fetch (Branch B) is carried out before the
        decision returns, since the estimate put it ahead of the prefill; if it fails the decision
        falls back to the target's own cache. `block_hashes`: see ConductorCore.route. `exclude`:
        nodes the caller will not use (a retry's failed node, a node its circuit breaker holds out).
        `priority`: the request's (SamplingParams.priority); its queue estimates, and so the SLO
        admission, count only the work a node serves before it."""
        self._ensure_loop()
        d = self.core.route(request_id, prompt_token_ids, block_hashes=block_hashes, exclude=exclude,
                            priority=priority)
        if d.fetch is not None:
            ok = await self._copy_prefix(d.fetch.source, d.fetch.target, list(prompt_token_ids[:d.fetch.num_tokens]))
            if not ok:
                d.fetch = None
                d.branch += "_fetch_failed"
                d.predicted_cached_tokens = d.local_cached_tokens
        if d.migration is not None:
            self._start_migrations()
        return d

    async def copy_prefix(self, source: str, target: str, token_ids: Sequence[int]) -> tuple[bool, str]:
        """Replicate a cached prefix from `source` to `target` now (an operator's forced migration);
        (ok, error). The index learns of the copy from the target's own KV events."""
        return await self._copy(source, target, list(token_ids))

    async def set_duty(self, name: str, duty: str) -> str:
        """An operator's order: flex node `name` is to take `duty` (it drains the other first), as
        the duty planner orders it. Returns the duty state the node reported it led to ("" if it
        could not be told). DutyOrderRefused for a node that is not flex or an order that would
        leave a duty with no node. The planner may later undo it: pause_duty_planner first."""
        self.core.order_duty(name, duty)
        return await self._tell_duty(name, duty)

    async def pause_duty_planner(self, paused: bool = True) -> None:
        """Stop (or restart) the planner's own orders, so duties set by hand stay as set. Not kept
        across a Conductor restart: a new incarnation starts with its planner running."""
        self.core.duties.paused = paused

    async def recent_decisions(self, n: int = 20) -> list[RouteDecision]:
        return self.core.recent_decisions(n)

    async def status(self) -> dict:
        """The core's status plus this incarnation's id (a restart changes it) and copy counts."""
        st = self.core.status()
        st["instance_id"] = self.instance_id
        st["pid"] = os.getpid()
        st["copies"] = {"ok": self.copies_ok, "failed": self.copies_failed}
        return st

    async def tick(self) -> list[str]:
        """One round of background work now (the loop does this every tick_interval_s); returns
        the nodes found dead."""
        res = self.core.tick()
        for name in self.core.index.nodes_needing_resync():
            self._start_resync(name)
        self._start_migrations()
        order = self.core.plan_duties()
        if order is not None:
            log.info("duty planner: %s takes the %s duty (%s)", order.node, order.duty, order.reason)
            self._spawn(self._tell_duty(order.node, order.duty.value))
        return res.dead

    # -- background ---------------------------------------------------------------------------
    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._background())

    async def _background(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_interval_s)
            try:
                await self.tick()
            except Exception:   # the loop must outlive any one bad round
                log.exception("conductor background tick failed")

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._copies.add(task)
        task.add_done_callback(self._copies.discard)

    def _start_resync(self, name: str) -> None:
        if name not in self._resyncing:
            self._resyncing.add(name)
            self._spawn(self._resync(name))

    async def _resync(self, name: str) -> None:
        import ray

        try:
            info = self.core.registry.get_alive(name)
            if info.handle is None:
                log.warning("node %s needs a KV re-sync but registered no handle", name)
                return
            last_seq, events = await asyncio.wait_for(_await(info.handle.kv_snapshot.remote()),
                                                      self.config.resync_timeout_s)
            self.core.resync(name, last_seq, events)
        except ray.exceptions.RayActorError:
            self.core.mark_dead(name, "actor died (re-sync)")
        except UnknownNodeError:
            pass
        except Exception:   # stays flagged: the next tick retries
            log.exception("KV re-sync of %s failed", name)
        finally:
            self._resyncing.discard(name)

    async def _tell_duty(self, name: str, duty: str) -> str:
        """Carry an order to the node with its stamp, which the node echoes in its reports. If it
        cannot be told, the Conductor believes the node's own reports again (the duty it kept)."""
        import ray

        stamp = 0.0
        try:
            info = self.core.registry.get_alive(name)
            stamp = info.duty_ordered_at
            if info.handle is None:
                raise UnknownNodeError(f"{name} registered without a handle")
            return await asyncio.wait_for(_await(info.handle.set_duty.remote(duty, stamp)),
                                          self.config.duty_order_timeout_s)
        except ray.exceptions.RayActorError:
            self.core.mark_dead(name, "actor died (duty order)")
            return ""
        except Exception as e:  # noqa: BLE001 - timeout, unknown node: keep serving, the reports decide
            log.warning("could not tell %s to take the %s duty: %s", name, duty, e)
            self.core.duty_order_lost(name, stamp)
            return ""

    def _start_migrations(self) -> None:
        for plan in self.core.take_migrations():
            self._spawn(self._migrate(plan))

    async def _migrate(self, plan: MigrationPlan) -> None:
        ok, error = await self._copy(plan.source, plan.target, list(plan.token_ids))
        # success is confirmed by the target's KV events (landed); a failure ends the plan now
        if not ok:
            self.core.finish_migration(plan.plan_id, False, error)

    async def _copy_prefix(self, source: str, target: str, token_ids: list[int]) -> bool:
        ok, _ = await self._copy(source, target, token_ids)
        return ok

    async def _copy(self, source: str, target: str, token_ids: list[int]) -> tuple[bool, str]:
        """Have `source` write the prefix's blocks into `target`, node to node (export/import,
        see the module docstring). Returns (ok, error)."""
        try:
            src = self.core.registry.get_alive(source)
            dst = self.core.registry.get_alive(target)
        except UnknownNodeError as e:
            return self._copied(False, str(e))
        if src.handle is None or dst.handle is None:
            return self._copied(False, "node registered without a handle")
        room = random.getrandbits(63)
        try:
            results = await asyncio.wait_for(asyncio.gather(
                _await(src.handle.export_prefix.remote(token_ids, room, target)),
                _await(dst.handle.import_prefix.remote(token_ids, room, src.bootstrap_address))),
                self.config.migration.timeout_s)
        except Exception as e:   # timeout, actor death, a node without the methods
            for h in (src.handle, dst.handle):
                try:
                    h.abort_migration.remote(room)
                except Exception:
                    pass
            return self._copied(False, f"{type(e).__name__}: {e}")
        errors = [getattr(r, "error", None) or "failed" for r in results if not getattr(r, "ok", False)]
        return self._copied(not errors, "; ".join(errors))

    def _copied(self, ok: bool, error: str) -> tuple[bool, str]:
        if ok:
            self.copies_ok += 1
        else:
            self.copies_failed += 1
            log.info("prefix copy failed: %s", error)
        return ok, error


async def _await(ref):
    return await ref


def topology_from_ray() -> Topology:
    """The topology from live Ray nodes' labels (raypd.io/tor, raypd.io/spine,
    raypd.io/nvlink-domain); every machine on the default ToR when none is labelled."""
    try:
        import ray

        labels = {n["NodeID"]: dict(n.get("Labels") or {}) for n in ray.nodes() if n.get("Alive")}
    except Exception:
        return Topology()
    return Topology.from_ray_labels(labels) if labels else Topology()


def start_conductor(name: str = DEFAULT_NAME, *, namespace: str | None = None, detached: bool = False,
                    config: ConductorConfig | None = None, topology: Topology | None = None,
                    topology_yaml: str | None = None, label_selector: dict[str, str] | None = None):
    """Create the named Conductor actor, or return the running one of that name; `label_selector`:
    the Ray nodes it may run on (cluster/launch/placement.py)."""
    import ray

    # Restarted by Ray whenever it dies: it holds only what the nodes can tell it again (they
    # re-register and re-send their caches, see register_node), and the ingress routes without it
    # meanwhile (cluster/client/conductor_router.py).
    opts: dict[str, Any] = {"name": name, "get_if_exists": True, "num_cpus": 0, "max_concurrency": 1000,
                            "max_restarts": -1}
    if namespace:
        opts["namespace"] = namespace
    if detached:
        opts["lifetime"] = "detached"
    if label_selector:
        opts["label_selector"] = label_selector
    return ray.remote(Conductor).options(**opts).remote(config, topology, topology_yaml)
