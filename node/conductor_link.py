"""ConductorLink: keeps the Conductor's view of one node current.

Runs as two tasks on the node actor's event loop: one registers the node (with its own actor handle,
so the Conductor can ask for a KV snapshot or a prefix copy), then every `interval_s` sends the KV
events the engine produced since the last batch (asked of the engine thread); the other, once the
node is registered, sends every `load_every_s` the engine's published LoadReport, which is also the
node's heartbeat: read without waiting for the engine thread, so a long step does not stop it. A Conductor that is briefly unreachable costs nothing but staleness: events are kept and
re-sent, and a lost batch shows up as a sequence gap, which makes the Conductor ask for a snapshot.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from raypd.metrics.task_events import untracked
from raypd.protocol.messages import HostInfo, KVEventBatch, LoadReport
from raypd.protocol.roles import Role

log = logging.getLogger(__name__)


class LinkedNode(Protocol):
    """What the link reads of a node actor: its identity and three of its Ray-callable methods."""
    @property
    def name(self) -> str: ...

    @property
    def role(self) -> Role: ...

    @property
    def host(self) -> HostInfo: ...

    async def ready(self) -> dict: ...

    async def drain_kv_events(self) -> KVEventBatch: ...

    async def published_load(self) -> LoadReport: ...


class ConductorLink:
    def __init__(self, node: LinkedNode, conductor: Any, self_handle: Any, interval_s: float = 0.1,
                 load_every_s: float = 0.5, call_timeout_s: float = 10.0):
        self.node = node
        self.conductor = conductor
        self.self_handle = self_handle
        self.interval_s = interval_s
        self.load_every_s = load_every_s
        self.call_timeout_s = call_timeout_s
        self.registered = False
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = [self._loop.create_task(self._run()), self._loop.create_task(self._beat())]

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    @property
    def stopped(self) -> bool:
        """Started, and every task of it cancelled or over."""
        return bool(self._tasks) and all(t.cancelled() or t.done() for t in self._tasks)

    def report_failed(self, reason: str) -> None:
        """The node can serve no more (its engine crashed): tell the Conductor now rather than let it
        wait for the heartbeat timeout, and stop the link so the node never registers again. Safe
        from any thread."""
        try:
            self.conductor.mark_dead.remote(self.node.name, reason)
        except Exception as e:  # noqa: BLE001 - the Conductor may be away; heartbeats expire anyway
            log.warning("could not report %s failed to the Conductor: %s", self.node.name, e)
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self.stop)
            except RuntimeError:  # the loop is closed: the task is gone with it
                pass

    async def register(self, timeout_s: float | None = None) -> None:
        """Register the node; `timeout_s` bounds the wait (default: call_timeout_s, the background's)."""
        info = await self.node.ready()
        await asyncio.wait_for(self.conductor.register_node.remote(
            self.node.name, self.node.role, self.node.host, self.self_handle, info.get("bootstrap_address", ""),
            info.get("kv_seq", 0), info.get("duty", "")), timeout_s or self.call_timeout_s)
        self.registered = True

    async def _run(self) -> None:
        while True:
            try:
                if not self.registered:
                    await self.register()
                batch = await self.node.drain_kv_events()
                if batch.events:
                    await self._call(untracked(self.conductor.report_kv_events).remote(batch))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the Conductor may restart; keep the node serving
                log.warning("conductor link of %s: %s", self.node.name, e)
                self.registered = False
            await asyncio.sleep(self.interval_s)

    async def _beat(self) -> None:
        """The heartbeat: the first as soon as the node is registered, then every load_every_s."""
        last = 0.0
        while True:
            if self.registered and time.monotonic() - last >= self.load_every_s:
                try:
                    await self._call(untracked(self.conductor.report_load).remote(await self.node.published_load()))
                    last = time.monotonic()
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - the Conductor may restart: register again
                    log.warning("conductor heartbeat of %s: %s", self.node.name, e)
                    # A node with no KV events to send learns of a restarted Conductor only here.
                    self.registered = False
            await asyncio.sleep(self.interval_s)

    async def _call(self, ref):
        return await asyncio.wait_for(ref, self.call_timeout_s)
