"""NodePool: the Serve deployment (one replica) that owns the application's node actors.

It starts them with the launcher (cluster.local_cluster) when the application deploys and stops
them when the application goes away (serve.shutdown, serve.delete, a RayService update), so the
nodes live exactly as long as the app, whether `raypd serve` or a Serve config file deployed it.
Ingress replicas ask it for the membership: the current node handles and their states, as its
NodeSupervisor (supervisor.py) keeps them, so nothing serves from a node list fixed at start. With
--autoscale its PoolScaler (cluster/autoscale/) adds and drains nodes by the SLO counts the ingress
replicas send (report_slo).

The replica is not the nodes' owner. The Conductor and the node actors are detached, named in the
namespace of this deployment of the app (ServeConfig.namespace, cluster/launch/adoption.py), so
when Serve replaces the replica (its process died, its host was lost) they serve on: streams run
node to ingress and the ingress keeps its last membership meanwhile. The replica Serve starts in
its place adopts them (NodeCluster.adopt: same handles, same incarnation, same cache) and starts
only what is missing.

Nothing detached may outlive the app. A replica that stops on purpose (__del__) kills every actor
of its namespace, unless Serve stops it to start another in the same deployment (the app is
RUNNING or UNHEALTHY: a health check failed, a Serve node drains): that one adopts them. When the
app goes away while no replica lives (deleted while its replica was down), nothing of this class
runs; then `raypd serve`'s stop kills the namespace's actors (cluster/cli/serve.py), a local Ray
stops with it, the next deployment of an app of this name kills what older ones left when its pool
starts, and on a long-lived cluster of your own `ray stop` does.
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
APP_STATUS_TIMEOUT_S = 5.0   # a stopping Serve that does not answer is going away: the nodes stop
# The app's statuses in which a stopping replica is replaced within the same deployment: its
# successor adopts the nodes. Any other (DELETING, DEPLOYING a new config, gone, no answer): they stop.
REPLACED_IN = ("RUNNING", "UNHEALTHY")


def successor_adopts(app_status: str | None) -> bool:
    """Whether a stopping pool replica leaves its nodes to the one Serve starts in its place."""
    return app_status in REPLACED_IN


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
                                         stall_timeout_s=config.stall_timeout_s,
                                         incarnations=self.cluster.incarnations,
                                         conductor_incarnation=self.cluster.conductor_incarnation)
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
        if cluster is None:
            return
        status = await self._app_status()
        if successor_adopts(status):
            log.info("the app is %s: its nodes stay for the node pool replica Serve starts next", status)
            return
        await asyncio.to_thread(cluster.stop)

    async def _app_status(self) -> str | None:
        """This app's status as Serve's controller has it now; None when it is gone or does not answer."""
        try:
            status = await asyncio.wait_for(asyncio.to_thread(serve.status), APP_STATUS_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - Serve shutting down: the app goes with it
            log.info("no answer from Serve on the app's status (%s): stopping the nodes", e)
            return None
        app = status.applications.get(self.config.app_name)
        return None if app is None else str(getattr(app.status, "value", app.status))
