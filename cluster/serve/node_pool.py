"""NodePool: the Serve deployment (one replica) that owns the application's node actors.

It starts them with the launcher (cluster.local_cluster) when the application deploys and stops
them when the application goes away (serve.shutdown, serve.delete, a RayService update), so the
nodes live exactly as long as the app, whether `raypd serve` or a Serve config file deployed it.
The node actors are owned by this replica's process: if Serve ever replaces the replica, its nodes
go with it and the new replica starts fresh ones. Ingress replicas ask it for the membership: the
current node handles and their states, as its NodeSupervisor (supervisor.py) keeps them, so nothing
serves from a node list fixed at start. With --autoscale its PoolScaler (cluster/autoscale/) adds and
drains nodes by the SLO counts the ingress replicas send (report_slo).
"""
from __future__ import annotations

import asyncio
import logging

from ray import serve

from raypd.cluster.autoscale.node_drain import NodeDrain
from raypd.cluster.autoscale.pool_scaler import PoolScaler
from raypd.cluster.autoscale.slo_counts import SloCounts
from raypd.cluster.client.membership import Membership
from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.launch.local_cluster import NodeCluster
from raypd.cluster.serve.config import ServeConfig
from raypd.cluster.serve.supervisor import NodeSupervisor

log = logging.getLogger(__name__)


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64,
                  # Node start-up failures (bad model, no memory) repeat on retry; fail the deploy early.
                  max_constructor_retry_count=1,
                  graceful_shutdown_timeout_s=60, health_check_timeout_s=60)
class NodePool:
    async def __init__(self, config: ServeConfig):  # type: ignore[misc]  # Serve awaits an async constructor
        self.config = config
        # The launcher blocks on ray.get while the nodes load their model; keep the replica's loop free.
        self.cluster = await asyncio.to_thread(NodeCluster.start, config.cluster_spec())
        log.info("raypd nodes up: %s", ", ".join(n.name for n in self.cluster.nodes))
        self.supervisor = NodeSupervisor(list(self.cluster.nodes), self.cluster.conductor,
                                         probe_interval_s=config.probe_interval_s,
                                         stall_timeout_s=config.stall_timeout_s)
        self.supervisor.start()
        self.scaler: PoolScaler | None = None
        if (scaling := config.autoscale_config()) is not None:
            self.scaler = PoolScaler(scaling, self.cluster, self.supervisor, self.cluster.conductor)
            self.scaler.start()

    async def nodes(self) -> list[NodeHandle]:
        """The current handle of every node, whatever its state."""
        return [m.node for m in self.supervisor.membership().members]

    async def membership(self) -> Membership:
        """The nodes and the Conductor with their states (client/membership.py)."""
        return self.supervisor.membership()

    async def report_slo(self, counts: SloCounts) -> None:
        """An ingress replica's SLO counts since its last report (cluster/autoscale/slo_reporter.py)."""
        if self.scaler is not None:
            self.scaler.report_slo(counts)

    async def autoscale_status(self) -> dict | None:
        """The scaler's view: nodes per scaled role, attainment over its window, its last orders."""
        return self.scaler.status() if self.scaler is not None else None

    async def drain_node(self, name: str) -> dict:
        """An operator's removal of node `name` (maintenance, a bad host): it is routed nothing new,
        its requests finish, then it is shut down and leaves the membership (node_drain.py). With
        autoscaling the scaler keeps its role at MIN or more, so a node below that is replaced.
        Returns {"node", "phase": removed | refused | called_off, "reason"}."""
        member = self.supervisor.membership().by_name.get(name)
        if member is None or not member.serving:
            raise ValueError(f"no serving node named {name!r}")
        drain = NodeDrain(member.node, self.supervisor, self.cluster.conductor, self.cluster.remove,
                          drain_timeout_s=self.config.request_timeout_s)
        phase = await drain.run()
        return {"node": name, "phase": phase.name.lower(), "reason": drain.reason}

    async def conductor(self):
        """The Conductor actor handle (None when the pool runs without one)."""
        return self.cluster.conductor

    async def __del__(self):
        scaler = getattr(self, "scaler", None)
        if scaler is not None:
            scaler.stop()   # first: no node may be added once the cluster stops
        supervisor = getattr(self, "supervisor", None)
        if supervisor is not None:
            supervisor.stop()
        cluster = getattr(self, "cluster", None)  # None when the constructor failed: nothing started
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)
