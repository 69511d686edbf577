"""Start (or join) a Ray cluster and place raypd's node actors on it; stop them again.

    with NodeCluster.start(ClusterSpec(prefill_nodes=1, decode_nodes=1)) as cluster:
        router = make_router(cluster.conductor, cluster.nodes)   # client/make_router.py

Each actor gets the Ray resources it asks for (num_cpus here, num_gpus on GPU clusters) and pins
torch to that many threads. Ray itself is joined or started by ray_init.init_ray.

By default the actors belong to the process that starts them and die with it. With spec.namespace
(the Serve node pool's: adoption.py) they are detached and named in that namespace, so they
outlive the pool replica that started them; a start there adopts the live ones instead of starting
them again, kills what older deployments of the same app left, and stop() kills everything left in
the namespace.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import ray

from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.launch import adoption
from raypd.cluster.launch.gpu_budget import check_gpus_per_node, cluster_gpus, gpus_per_node
from raypd.cluster.launch.named_actors import kill_named, kill_namespace, restarts_of
from raypd.cluster.launch.placement import (
    ROLE_LABEL,
    NoControlPlaneMachine,
    check_control_plane_machine,
    control_plane_selector,
    placement_label,
)
from raypd.cluster.launch.ray_init import init_ray, reason, stop_ray
from raypd.conductor.actor import start_conductor
from raypd.conductor.config import TPOT_TARGET_SHARE, ConductorConfig, DutyPlannerConfig, LocalPrefillConfig
from raypd.conductor.topology import Topology
from raypd.kvtransfer.data_plane_auth import DataPlaneSecret, process_secret
from raypd.kvtransfer.identity import DataPlaneIdentity
from raypd.protocol.duty import Duty
from raypd.protocol.roles import Role

log = logging.getLogger(__name__)


# How long the nodes already running get to take a new node's key (a Ray call each, answered off
# the engine thread) before the cluster goes on without the ones that did not answer.
ADMIT_TIMEOUT_S = 30.0
NODE_CLASSES = {Role.PREFILL: ("raypd.prefill_node.prefill_node", "PrefillNode"),
                Role.DECODE: ("raypd.decode_node.decode_node", "DecodeNode"),
                Role.MIXED: ("raypd.node.mixed_node", "MixedNode"),
                Role.FLEX: ("raypd.flex_node.flex_node", "FlexNode")}


class ClusterStartError(RuntimeError):
    """A node actor could not start (bad model path, out of memory, ...): the reason is in the message."""


@dataclass(frozen=True)
class ClusterSpec:
    prefill_nodes: int = 0
    decode_nodes: int = 0
    mixed_nodes: int = 0
    model: str | None = None
    engine_options: dict = field(default_factory=dict)
    # Per-role overrides merged over engine_options, e.g. {"decode": {"num_blocks": 64}}.
    role_engine_options: dict = field(default_factory=dict)
    transfer_options: dict = field(default_factory=dict)
    cpus_per_node: float = 1.0
    # GPUs each node actor asks Ray for (0 < g <= 1; gpu_budget.py); None: 1 where the Ray cluster has GPUs, else 0.
    gpus_per_node: float | None = None
    prealloc_timeout_s: float | None = None  # decode: wait for KV memory; None = the bootstrap timeout
    start_timeout_s: float = 300.0
    # Place each node actor only on Ray nodes labelled raypd.io/role=<its role> (GPU clusters whose
    # machines are sized per role); False = anywhere with free resources (a laptop, one box).
    place_by_role: bool = False
    # Logical CPUs of a Ray started here; None = enough for the spec's nodes (at least the core count).
    # Raise it to add nodes later (add_nodes) without waiting on resources.
    ray_cpus: int | None = None
    name_prefix: str = "raypd"
    # None: the actors are owned by the starting process. Else the Ray namespace of one deployment
    # of a Serve app (adoption.app_namespace): the Conductor and the nodes are detached and named
    # there, and a start adopts the live ones it finds there (module docstring).
    namespace: str | None = None
    # Routing: None = the driver's round-robin, no Conductor; else a Conductor policy name
    # (round_robin, least_loaded, cache_aware, cost) and optionally a topology YAML file.
    policy: str | None = None
    topology_file: str | None = None
    conductor_options: dict = field(default_factory=dict)  # ConductorConfig fields
    # Split or local per request (conductor/split_or_local.py): None = always split; else the
    # Conductor may let a decode node prefill a prompt itself, and decode nodes compute at most this
    # many prompt tokens per step (EngineConfig.max_prefill_tokens_per_step). Needs a policy and PD nodes.
    local_prefill_budget: int | None = None
    # Start the PD nodes as flex nodes (flex_node/flex_node.py): prefill_nodes of them in the prefill duty,
    # decode_nodes in the decode duty, and the Conductor's duty planner moves them between the two as
    # the load shifts (conductor/planners/duties.py). With local_prefill_budget it may leave no node in
    # the prefill duty (every node then prefills its own prompts). Needs a policy.
    flex: bool = False
    # Flex only: the TPOT the deployment aims for. The duty planner moves a node to decode once decode
    # steps pass TPOT_TARGET_SHARE of it (DutyPlannerConfig.decode_busy_step_s); None: only decode KV
    # memory calls for one.
    tpot_target_s: float | None = None
    # How many times Ray restarts a node actor that died (SIGKILL, OOM, an engine crash): the same
    # name and constructor args, a fresh engine; the node pool re-attaches it. 0: a death is final.
    max_node_restarts: int = 0
    # What this cluster derives each node's data-plane key pair from (kvtransfer/identity.py): a node
    # gets only its own keys and its peers' public keys, never this. By default the driver process's
    # own; `raypd serve` makes one per deployment (or reads it from RAYPD_DATA_PLANE_SECRET). Never logged.
    data_plane_secret: DataPlaneSecret = field(default_factory=process_secret, repr=False, compare=False)
    # The nodes' Ray-callable chaos hooks (crash_engine, fail_requests) answer: chaos tests and benchmarks only.
    chaos_hooks: bool = False

    def __post_init__(self) -> None:
        if min(self.prefill_nodes, self.decode_nodes, self.mixed_nodes) < 0:
            raise ValueError("node counts must be >= 0")
        if (self.prefill_nodes > 0) != (self.decode_nodes > 0):
            raise ValueError("PD mode needs at least one prefill node and one decode node")
        if self.cpus_per_node <= 0:
            raise ValueError("cpus_per_node must be > 0")
        check_gpus_per_node(self.gpus_per_node)
        if self.max_node_restarts < 0:
            raise ValueError("max_node_restarts must be >= 0")
        if self.tpot_target_s is not None:
            if not self.tpot_target_s > 0:
                raise ValueError("tpot_target_s must be > 0 seconds")
            if not self.flex:
                raise ValueError("tpot_target_s steers the duty planner: it needs flex nodes")
        if self.local_prefill_budget is not None:
            if self.local_prefill_budget < 1:
                raise ValueError("local_prefill_budget must be >= 1 prompt tokens per step")
            if self.policy is None or not self.decode_nodes:
                raise ValueError("local prefill needs a Conductor policy and decode nodes (it chooses per request)")
        if self.flex and (self.policy is None or not self.decode_nodes):
            raise ValueError("flex nodes need a Conductor policy (its planner sets their duties) and PD node counts")

    def roles(self) -> list[Role]:
        pd = [Role.FLEX] * (self.prefill_nodes + self.decode_nodes) if self.flex else \
            [Role.PREFILL] * self.prefill_nodes + [Role.DECODE] * self.decode_nodes
        return pd + [Role.MIXED] * self.mixed_nodes

    def duties(self) -> list[Duty | None]:
        """Each of roles()'s nodes' first duty (None: a fixed role)."""
        if not self.flex:
            return [None] * len(self.roles())
        return [Duty.PREFILL] * self.prefill_nodes + [Duty.DECODE] * self.decode_nodes + [None] * self.mixed_nodes


class NodeCluster:
    def __init__(self, spec: ClusterSpec, started_ray: bool):
        self.spec = spec
        self.nodes: list[NodeHandle] = []
        self._started_ray = started_ray
        self._counters: dict[Role, int] = {}   # per role, the index of its next node's name
        self.conductor = None  # the Conductor actor handle when spec.policy is set
        # Ray's restart count of each adopted node and of an adopted Conductor: the incarnation the
        # node pool's supervisor goes on from (0 for what this cluster started).
        self.incarnations: dict[str, int] = {}
        self.conductor_incarnation = 0

    @classmethod
    def start(cls, spec: ClusterSpec, address: str | None = None) -> NodeCluster:
        """Start Ray here (or join `address`) and the spec's nodes, all loading in parallel. With
        spec.namespace, first adopt what runs there (adopt()) and start only what is missing."""
        started_ray = init_ray(address, spec.cpus_per_node * len(spec.roles()), num_cpus=spec.ray_cpus,
                               local_options={"include_dashboard": False}, log_to_driver=False).started
        spec = replace(spec, gpus_per_node=gpus_per_node(spec.gpus_per_node, cluster_gpus()))
        cluster = cls(spec, started_ray)
        try:
            found = cluster._find()
            if spec.policy is not None:   # a running one of its name is the one it gets (get_if_exists)
                cluster.conductor = _start_conductor(spec, spec.policy)
                if found.conductor:
                    cluster.conductor_incarnation = restarts_of(cluster.conductor)
            cluster.adopt(found.nodes)
            todo = adoption.missing(spec.roles(), spec.duties(), [n.role for n in cluster.nodes])
            if todo:
                cluster.add_nodes([role for role, _ in todo], duties=[duty for _, duty in todo])
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _find(self) -> adoption.Found:
        """This deployment's live actors in its namespace; what older deployments of the app left is
        killed here (nothing else would: their pool is gone)."""
        if self.spec.namespace is None:
            return adoption.Found((), False, ())
        found = adoption.find(ray.util.list_named_actors(all_namespaces=True), self.spec.namespace,
                              self.spec.name_prefix)
        if found.stale:
            log.warning("killing %d actor(s) an older deployment of this app left: %s", len(found.stale),
                        ", ".join(f"{ns}:{name}" for ns, name in found.stale))
            for namespace, name in found.stale:
                kill_named(name, namespace)
        return found

    def adopt(self, names: Sequence[str]) -> list[NodeHandle]:
        """Take over the node actors `names` of this namespace (a pool replica's predecessor started
        them): each must answer ready() within the start timeout as the role its name says; it keeps
        its incarnation (Ray's restart count) and its cache. One that does not is killed (the caller
        starts a node in its place). Each is attached to the Conductor unless it is registered
        there already, and a drain its old pool left half done is called off."""
        actors = {}
        for name in names:
            parsed = adoption.parse_node_name(self.spec.name_prefix, name)
            if parsed is None:
                continue
            try:
                actors[name] = (parsed[0], ray.get_actor(name, namespace=self.spec.namespace))
            except ValueError:   # gone since the listing
                continue
        refs = {name: actor.ready.remote() for name, (_, actor) in actors.items()}
        if refs:
            ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.spec.start_timeout_s)
        adopted = []
        for name, (role, actor) in actors.items():
            try:
                info = ray.get(refs[name], timeout=0)
                if info.get("role") != role:
                    raise ClusterStartError(f"it answers as a {info.get('role')} node")
            except Exception as e:  # noqa: BLE001 - a node that cannot be adopted is replaced
                log.warning("not adopting node %s (killed, a new one starts): %s", name, reason(e))
                ray.kill(actor)
                continue
            adopted.append(NodeHandle(name, role, actor, info["host"], info["num_blocks"],
                                      info.get("bootstrap_address", ""), info.get("public_key", "")))
            self.incarnations[name] = restarts_of(actor)
        self._counters.update(adoption.next_indices(self.spec.name_prefix, names))
        # Whatever an adopted node was told before, it now admits exactly what this cluster has.
        self._admit(adopted, [*self.nodes, *adopted])
        if self.conductor is not None and adopted:
            status = ray.get(self.conductor.status.remote(), timeout=60)["nodes"]
            unregistered = [h for h in adopted if not status.get(h.name, {}).get("alive")]
            ray.get([h.actor.attach_conductor.remote(self.conductor) for h in unregistered], timeout=60)
            ray.get([self.conductor.retire_node.remote(h.name, False) for h in adopted
                     if status.get(h.name, {}).get("retiring")], timeout=60)
        if adopted:
            log.info("adopted node(s) %s", ", ".join(f"{h.name} (incarnation {self.incarnations[h.name]})"
                                                     for h in adopted))
        self.nodes.extend(adopted)
        return adopted

    def add_nodes(self, roles: Sequence[Role | str], engine_options: dict | None = None,
                  transfer_options: dict | None = None, duties: Sequence[Duty | None] | None = None) -> list[NodeHandle]:
        """Start nodes of the given roles (options merged over the spec's) and wait until they are
        ready. `duties`: the flex nodes' first duties, one per role (decode by default)."""
        named = []
        for role, duty in zip(map(Role.parse, roles), duties or [None] * len(roles), strict=True):
            n = self._counters.get(role, 0)
            self._counters[role] = n + 1
            named.append((adoption.node_name(self.spec.name_prefix, role, n), role, duty))
        # Each new node admits every node of the cluster, itself and the other new ones included.
        peers = [n.name for n in self.nodes] + [name for name, _, _ in named]
        created = [(name, role, _create_actor(self.spec, role, name, engine_options or {}, transfer_options or {},
                                              duty, self.spec.data_plane_secret.identity(name, peers)))
                   for name, role, duty in named]
        try:
            hint = ""
            if self.spec.place_by_role:
                labels = ", ".join(sorted({f"{ROLE_LABEL}={placement_label(Role.parse(r))}" for r in roles}))
                hint = f" (place_by_role: is there a Ray node labelled {labels} with free resources?)"
            infos = _wait_ready([a for _, _, a in created], self.spec.start_timeout_s, hint)
        except BaseException:
            for _, _, actor in created:
                ray.kill(actor)
            raise
        handles = [NodeHandle(name, role, actor, info["host"], info["num_blocks"], info.get("bootstrap_address", ""),
                              info.get("public_key", ""))
                   for (name, role, actor), info in zip(created, infos)]
        self._admit(self.nodes, handles)  # the nodes already here admit the new ones before anyone routes to them
        if self.conductor is not None:
            # Nodes register themselves (with their own handle) and then stream KV events and loads.
            ray.get([h.actor.attach_conductor.remote(self.conductor) for h in handles], timeout=60)
        self.nodes.extend(handles)
        return handles

    def _admit(self, nodes: Sequence[NodeHandle], peers: Sequence[NodeHandle]) -> None:
        """Register `peers`' data-plane keys with `nodes` (NodeActor.admit_peers). A node that does not
        answer is dead or restarting; the supervisor hands a restarted node the whole list."""
        keys = {p.name: p.public_key for p in peers if p.public_key}
        if not nodes or not keys:
            return
        refs = {n.name: n.actor.admit_peers.remote(keys) for n in nodes}
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=ADMIT_TIMEOUT_S)
        for name, ref in refs.items():
            try:
                ray.get(ref, timeout=0)
            except Exception as e:  # noqa: BLE001 - see the docstring
                log.warning("node %s did not take the new peers' keys: %s", name, reason(e))

    def by_role(self, role: Role | str) -> list[NodeHandle]:
        return [n for n in self.nodes if n.role == role]

    def remove(self, node: NodeHandle) -> None:
        """Forget a node (after it died or was killed); stop() will not touch it."""
        self.nodes = [n for n in self.nodes if n.name != node.name]

    def stop(self, timeout_s: float = 20.0) -> None:
        """Ask each node to close its transfer endpoint, then kill the actors (and Ray if we started
        it); with a namespace, also whatever else is left in it."""
        refs = [n.actor.shutdown.remote() for n in self.nodes]
        if refs:
            try:
                ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            except ray.exceptions.RayError:
                pass
        for n in self.nodes:
            ray.kill(n.actor)
        self.nodes = []
        if self.conductor is not None:
            ray.kill(self.conductor)
            self.conductor = None
        if self.spec.namespace is not None:
            kill_namespace(self.spec.namespace)
        if self._started_ray:
            stop_ray(started=True)
            self._started_ray = False

    def __enter__(self) -> NodeCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def conductor_config(spec: ClusterSpec, policy: str) -> ConductorConfig:
    """What the spec asks of the Conductor; spec.conductor_options win over what is derived here."""
    derived: dict = {"policy": policy}
    if spec.local_prefill_budget is not None:
        derived["local_prefill"] = LocalPrefillConfig(enabled=True, step_budget_tokens=spec.local_prefill_budget)
    if spec.flex:
        duties: dict = {}
        if spec.local_prefill_budget is not None:  # every node may prefill its own prompts: the prefill duty may empty
            duties["min_prefill_nodes"] = 0
        if spec.tpot_target_s is not None:
            duties["decode_busy_step_s"] = TPOT_TARGET_SHARE * spec.tpot_target_s
        if duties:
            derived["duties"] = DutyPlannerConfig(**duties)
    # One replace, so the config is checked once with every field final.
    return replace(ConductorConfig(), **(derived | spec.conductor_options))


def _start_conductor(spec: ClusterSpec, policy: str):
    if spec.place_by_role:
        try:
            check_control_plane_machine(ray.nodes())
        except NoControlPlaneMachine as e:
            raise ClusterStartError(str(e)) from None
    config = conductor_config(spec, policy)
    # Parsed here, so a bad file fails the launch with its reason, and the actor may run elsewhere.
    topology = Topology.from_yaml(spec.topology_file) if spec.topology_file else None
    conductor = start_conductor(name=adoption.conductor_name(spec.name_prefix), namespace=spec.namespace,
                                detached=spec.namespace is not None, config=config, topology=topology,
                                label_selector=control_plane_selector(spec.place_by_role))
    try:  # answered once constructed: nodes register with a Conductor that is there
        ray.get(conductor.status.remote(), timeout=spec.start_timeout_s)
    except ray.exceptions.GetTimeoutError as e:
        raise ClusterStartError(f"the Conductor did not start within {spec.start_timeout_s:.0f}s") from e
    except ray.exceptions.RayActorError as e:
        raise ClusterStartError(f"the Conductor failed to start: {reason(getattr(e, 'cause', None) or e)}") from e
    return conductor


def _create_actor(spec: ClusterSpec, role: Role, name: str, engine_options: dict, transfer_options: dict,
                  duty: Duty | None, identity: DataPlaneIdentity):
    module, cls_name = NODE_CLASSES[role]
    cls = getattr(__import__(module, fromlist=[cls_name]), cls_name)
    budget = {"max_prefill_tokens_per_step": spec.local_prefill_budget} \
        if role in (Role.DECODE, Role.FLEX) and spec.local_prefill_budget is not None else {}
    options = {**spec.engine_options, **budget, **spec.role_engine_options.get(role, {}), **engine_options}
    if role is Role.DECODE:
        # A decode node computes no prompts (the Conductor's local path aside), so a tier below its pool
        # would only cost it writes on its decode steps: the tiers belong to the nodes that prefill.
        for key in ("kv_tier_dir", "kv_host_tier_size_mb"):
            options.pop(key, None)
    if options.get("kv_tier_dir"):  # one tier folder per node, kept across its restarts (same name)
        options["kv_tier_dir"] = os.path.join(options["kv_tier_dir"], name)
    kwargs = {"name": name, "model": spec.model, "engine_options": options, "num_cpus": spec.cpus_per_node,
              "data_plane_identity": identity, "chaos_hooks": spec.chaos_hooks}
    if role is not Role.MIXED:  # prefill and decode nodes hand KV over: they own a transfer endpoint
        kwargs["transfer_options"] = {**spec.transfer_options, **transfer_options}
    if role in (Role.DECODE, Role.FLEX):
        kwargs["prealloc_timeout_s"] = spec.prealloc_timeout_s
    if role is Role.FLEX:
        kwargs["duty"] = duty or Duty.DECODE
    where: dict = {"label_selector": {ROLE_LABEL: placement_label(role)}} if spec.place_by_role else {}
    if spec.namespace is not None:   # outlives the node pool replica that creates it (module docstring)
        where |= {"namespace": spec.namespace, "lifetime": "detached"}
    remote = ray.remote(cls).options(name=name, num_cpus=spec.cpus_per_node, num_gpus=spec.gpus_per_node,
                                     max_concurrency=1000, max_restarts=spec.max_node_restarts, **where)
    return remote.remote(**kwargs)


def _wait_ready(actors: list, timeout_s: float, hint: str = "") -> list[dict]:
    refs = [a.ready.remote() for a in actors]
    deadline = time.monotonic() + timeout_s
    try:
        return ray.get(refs, timeout=max(1.0, deadline - time.monotonic()))
    except ray.exceptions.GetTimeoutError as e:
        raise ClusterStartError(f"node actors did not start within {timeout_s:.0f}s{hint}") from e
    except ray.exceptions.RayActorError as e:
        cause = getattr(e, "cause", None) or e
        raise ClusterStartError(f"a node actor failed to start: {reason(cause)}") from e
