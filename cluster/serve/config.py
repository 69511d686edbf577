"""ServeConfig: everything one raypd Serve application is made of, frozen and validated once.

`raypd serve` builds it from flags; `cluster.serve_app:app_builder` from the args of a Serve config
file (serve run / a KubeRay RayService). The same object reaches the node pool and every ingress
replica, so they agree on the model, the node counts and the limits.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from raypd.cluster.autoscale.config import AutoscaleConfig, AutoscaleConfigError, parse_autoscale
from raypd.cluster.launch.adoption import app_namespace, new_deployment_id
from raypd.cluster.launch.gpu_budget import GpuBudgetError, check_gpus_per_node, gpus_per_node
from raypd.cluster.launch.local_cluster import ClusterSpec
from raypd.cluster.openai.api_keys import KeyRing, KeysFileError
from raypd.kvtransfer.config import TransferConfig
from raypd.kvtransfer.data_plane_auth import SECRET_ENV, DataPlaneSecret, data_plane_secret_from_env
from raypd.protocol.roles import Role


class ServeConfigError(ValueError):
    """A serve option is out of range or inconsistent; the message is the one line a user sees."""


@dataclass(frozen=True)
class ServeConfig:
    model: str | None = None              # HF folder or .gguf; None = the embedded SmolLM2
    served_model_name: str | None = None  # the id clients send as "model"; default: from the path
    prefill_nodes: int = 1
    decode_nodes: int = 1
    mixed_nodes: int = 0
    cpus_per_node: float = 1.0
    gpus_per_node: float | None = None    # None: 1 where the Ray cluster has GPUs, else 0 (gpu_budget.py)
    place_by_role: bool = False           # node actors only on Ray nodes labelled raypd.io/role=<role>
    engine_options: dict = field(default_factory=dict)
    transfer_options: dict = field(default_factory=dict)
    # Routing policy of the Conductor actor the node pool starts; the ingress routes through it.
    policy: str = "cost"
    topology: str | None = None           # topology file for the Conductor (passed through)
    api_key: str | None = field(default=None, repr=False)  # a secret: never in a repr or a log line
    # Several keys, each with its tenant and default priority (cluster/openai/api_keys.py); with
    # api_key too, both are accepted. A path on every host that runs an ingress replica.
    api_keys_file: str | None = None
    # Tenants share the ingress's line and each node's waiting queue by tokens served
    # (protocol/fair_share.py). False: every request counts as one tenant's (cluster/openai/guard.py),
    # so both order by priority, then arrival; for comparing runs with and without fairness.
    tenant_fairness: bool = True
    max_body_bytes: int = 4 << 20
    default_max_tokens: int | None = None  # output cap when a request sets none (None: rest of the context)
    ingress_replicas: int = 1
    ingress_cpus: float = 0.0             # the nodes do the heavy work; 0 keeps a small box schedulable
    chunk_timeout_s: float = 120.0        # the driver gives up on a node silent for this long
    # A request's total deadline from its arrival (body upload, prompts, generation): then 504 (or an
    # error event in a stream) and its work on the nodes is aborted. Long enough for a long output.
    request_timeout_s: float = 600.0
    # Fault tolerance (docs/architecture.md, "Failure model").
    max_node_restarts: int = 10           # Ray restarts a dead node actor up to this many times
    retry_limit: int = 3                  # re-routes of a request that failed before its first token
    migration_limit: int = 3              # replays of a request whose decode failed after tokens were sent
    # How long a request that finds no node waits for one to come back (a restarting node: with one
    # decode node, every request while Ray restarts it); then 503. Below request_timeout_s to matter.
    recovery_wait_s: float = 60.0
    probe_interval_s: float = 1.0         # the node pool's health probes of every node and the Conductor
    # A node whose engine turn (one step, usually) has run this long is hung: out of routing until it
    # ends. Probes never wait for a step, so a long step alone (a big model, a long prefill chunk on
    # CPU) costs nothing below this.
    stall_timeout_s: float = 60.0
    chaos_hooks: bool = False             # nodes answer crash_engine / fail_requests (chaos tests only)
    route_timeout_s: float = 5.0          # the Conductor's deadline per decision; then the local fallback
    breaker_failures: int = 3             # a node failing this many requests within breaker_window_s ...
    breaker_window_s: float = 30.0
    breaker_cooldown_s: float = 10.0      # ... leaves routing for this long, then one probe request
    # Back-pressure (docs/architecture.md, "Back-pressure"). Per ingress replica: generation requests
    # in progress, and more waiting for one of those slots; the next gets 429 + Retry-After. None:
    # derived from what the nodes hold (admission_limits()). The nodes' own bound is the engine
    # option max_waiting_requests.
    max_ongoing_requests: int | None = None
    max_queued_requests: int | None = None
    ttft_slo_s: float | None = None       # the Conductor rejects (429) a request whose estimated TTFT exceeds it
    # Adaptive disaggregation: the PD nodes start as flex nodes whose duty (prefill or decode) the
    # Conductor's planner moves as the load shifts (conductor/planners/duties.py), and per request the
    # Conductor chooses the split path or lets the decode node prefill the prompt itself
    # (conductor/split_or_local.py), at most local_prefill_budget prompt tokens per decode step so its
    # running requests keep their TPOT.
    adaptive: bool = False
    local_prefill_budget: int = 32
    # With adaptive: the TPOT to hold; decode steps past 0.8 of it move a node to decode
    # (ClusterSpec.tpot_target_s). None: only decode KV memory does.
    tpot_target_s: float | None = None
    # SLO-driven scaling of the node pool (cluster/autoscale/): the --autoscale ranges ("1:3", or
    # "prefill=1:2,decode=1:4"); None: the pool keeps the sizes it started with. The node counts above
    # are the sizes it starts with, inside the ranges. It adds a node of a role when fewer than
    # autoscale_attainment of the requests of the last autoscale_window_s met both targets (or its
    # queue grows), and drains and removes one when the role idles.
    autoscale: str | None = None
    autoscale_ttft_s: float | None = None
    autoscale_tpot_s: float | None = None
    autoscale_attainment: float = 0.9
    autoscale_window_s: float = 30.0
    autoscale_options: dict = field(default_factory=dict)   # AutoscaleConfig's other fields (holds, cooldowns)
    app_name: str = "raypd"
    # This deployment of the app (one serve.run, one apply of a Serve config), made once here so the
    # node pool's replicas share it: its actors live in a namespace of their own
    # (cluster/launch/adoption.py), which a replica Serve starts in place of a lost one adopts, and
    # which a newer deployment never adopts (its config may differ) but cleans up.
    deployment_id: str = field(default_factory=new_deployment_id, compare=False)
    # Proven by every data plane connection (kvtransfer/data_plane_auth.py). None: taken from the
    # environment variable RAYPD_DATA_PLANE_SECRET (the Helm chart fills it from a Kubernetes Secret),
    # else a fresh random one; made once here, so the node pool and every ingress replica share it.
    data_plane_secret: DataPlaneSecret | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.data_plane_secret is None:
            try:
                secret = data_plane_secret_from_env()
            except ValueError as e:
                raise ServeConfigError(f"{SECRET_ENV}: {e}") from None
            object.__setattr__(self, "data_plane_secret", secret)
        counts = (self.prefill_nodes, self.decode_nodes, self.mixed_nodes)
        if any(not isinstance(c, int) or c < 0 for c in counts):
            raise ServeConfigError("node counts must be integers >= 0")
        if (self.prefill_nodes > 0) != (self.decode_nodes > 0):
            raise ServeConfigError("PD needs at least one prefill node and one decode node (or use --mixed-nodes)")
        if self.prefill_nodes and self.mixed_nodes:
            raise ServeConfigError("run either prefill + decode nodes or mixed nodes, not both")
        if not any(counts):
            raise ServeConfigError("no nodes: set --prefill-nodes and --decode-nodes, or --mixed-nodes")
        from raypd.conductor.policies import POLICIES  # the Conductor's registry is the one list of names
        if self.policy not in POLICIES:
            raise ServeConfigError(f"unknown policy {self.policy!r}; one of {', '.join(sorted(POLICIES))}")
        if self.topology is not None and not Path(self.topology).is_file():
            raise ServeConfigError(f"topology file not found: {self.topology}")
        if self.cpus_per_node <= 0 or self.ingress_cpus < 0:
            raise ServeConfigError("--cpus-per-node must be > 0 and ingress cpus >= 0")
        try:
            check_gpus_per_node(self.gpus_per_node)
        except GpuBudgetError as e:
            raise ServeConfigError(str(e)) from None
        if not isinstance(self.tenant_fairness, bool):
            raise ServeConfigError("tenant_fairness must be true or false")
        if self.ingress_replicas < 1:
            raise ServeConfigError("ingress_replicas must be >= 1")
        if self.max_body_bytes < 1024:
            raise ServeConfigError("max_body_bytes must be >= 1024")
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ServeConfigError("default_max_tokens must be >= 1")
        if not self.request_timeout_s > 0:
            raise ServeConfigError("--request-timeout must be > 0 seconds")
        if not self.recovery_wait_s >= 0:
            raise ServeConfigError("--recovery-wait must be >= 0 seconds")
        for name in ("max_node_restarts", "retry_limit", "migration_limit"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ServeConfigError(f"--{name.replace('_', '-')} must be an integer >= 0")
        if self.breaker_failures < 1:
            raise ServeConfigError("breaker_failures must be >= 1")
        if min(self.probe_interval_s, self.route_timeout_s, self.breaker_window_s, self.breaker_cooldown_s) <= 0:
            raise ServeConfigError("probe_interval_s, route_timeout_s and the breaker times must be > 0")
        if not self.stall_timeout_s > 0:
            raise ServeConfigError("--stall-timeout must be > 0 seconds")
        for name, low in (("max_ongoing_requests", 1), ("max_queued_requests", 0)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
                raise ServeConfigError(f"--{name.replace('_', '-')} must be an integer >= {low}")
        if self.adaptive and not self.decode_nodes:
            raise ServeConfigError("--adaptive chooses between prefill and decode nodes: it needs both")
        if not isinstance(self.local_prefill_budget, int) or self.local_prefill_budget < 1:
            raise ServeConfigError("--local-prefill-budget must be an integer >= 1 (prompt tokens per decode step)")
        if self.tpot_target_s is not None and not (self.tpot_target_s > 0 and self.adaptive):
            raise ServeConfigError("--tpot-target must be > 0 seconds, and steers --adaptive's duty planner: "
                                   "it needs --adaptive")
        if self.ttft_slo_s is not None and not self.ttft_slo_s > 0:
            raise ServeConfigError("--ttft-slo must be > 0 seconds")
        self.autoscale_config()  # the ranges and targets are valid and fit the node counts
        self.admission_limits()  # the engine options it reads are valid
        try:  # every node actor makes its TransferConfig from these: a bad one fails here, once
            TransferConfig(**self.transfer_options)
        except (TypeError, ValueError) as e:
            raise ServeConfigError(f"transfer options: {e}") from None

    @classmethod
    def from_args(cls, args: dict) -> ServeConfig:
        """From a Serve config file's `args` (unknown keys are an error, not silently dropped)."""
        known = {f.name for f in fields(cls)} - {"data_plane_secret", "deployment_id"}  # made, never given
        if "data_plane_secret" in args:  # a Serve config file is shown in the dashboard: no secrets there
            raise ServeConfigError(f"the data plane secret is read from {SECRET_ENV}, not from the app args")
        unknown = sorted(set(args) - known)
        if unknown:
            raise ServeConfigError(f"unknown raypd app args: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if args.get("mixed_nodes") and "prefill_nodes" not in args and "decode_nodes" not in args:
            args = {**args, "prefill_nodes": 0, "decode_nodes": 0}  # mixed alone means no PD nodes, as the CLI
        return cls(**args)

    def key_ring(self) -> KeyRing | None:
        """The keys the ingress accepts (None: no key needed); ServeConfigError for a bad keys file."""
        ring = KeyRing.single(self.api_key) if self.api_key else None
        if self.api_keys_file is not None:
            try:
                from_file = KeyRing.from_file(self.api_keys_file)
            except KeysFileError as e:
                raise ServeConfigError(str(e)) from None
            ring = ring.merged(from_file) if ring else from_file
        return ring

    @property
    def secret(self) -> DataPlaneSecret:
        assert self.data_plane_secret is not None  # set in __post_init__
        return self.data_plane_secret

    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.model is None:
            from raypd.engine.model.source import DEFAULT_MODEL_FILE
            return Path(DEFAULT_MODEL_FILE).stem
        path = Path(self.model)
        return path.stem if path.suffix == ".gguf" else path.name

    def admission_limits(self, cluster_gpus: float = 0.0) -> tuple[int, int]:
        """(max_ongoing, max_queued) of one ingress replica. Unset, max_ongoing is what the decode
        (or mixed) nodes hold - max_running_requests running plus max_waiting_requests waiting each,
        by the batch defaults of the nodes' device kind - shared among the replicas, and max_queued
        the same again waiting at the ingress. cluster_gpus: what the Ray cluster reports, which
        decides where nodes with the default device and --gpus-per-node run."""
        from raypd.engine.config import BATCH_DEFAULTS, EngineConfig  # the engine's defaults: the one source

        device = str(self.engine_options.get("device", "auto"))
        on_gpu = device.startswith("cuda") or (
            device == "auto" and gpus_per_node(self.gpus_per_node, cluster_gpus) > 0)
        try:
            engine = EngineConfig(**(BATCH_DEFAULTS["cuda" if on_gpu else "cpu"] | self.engine_options))
        except Exception as e:  # noqa: BLE001 - unknown option (TypeError) or bad value (ConfigError)
            raise ServeConfigError(f"engine options: {e}") from None
        prefill, decode, mixed = self.most_nodes()
        decoding = decode + mixed + (prefill if self.adaptive else 0)  # flex may decode
        held = decoding * (engine.max_running_requests + engine.waiting_limit)
        ongoing = self.max_ongoing_requests or max(1, -(-held // self.ingress_replicas))
        return ongoing, ongoing if self.max_queued_requests is None else self.max_queued_requests

    def started_roles(self) -> list[Role]:
        """The roles the pool starts nodes of (flex for both PD halves with adaptive)."""
        if self.mixed_nodes:
            return [Role.MIXED]
        return [Role.FLEX] if self.adaptive else [Role.PREFILL, Role.DECODE]

    def autoscale_config(self) -> AutoscaleConfig | None:
        """The pool scaler's configuration (None: no autoscaling); ServeConfigError when it does not fit."""
        if self.autoscale is None:
            if self.autoscale_ttft_s is not None or self.autoscale_tpot_s is not None or self.autoscale_options:
                raise ServeConfigError("--autoscale-ttft, --autoscale-tpot and autoscale options need --autoscale")
            return None
        if self.autoscale_ttft_s is None or self.autoscale_tpot_s is None:
            raise ServeConfigError("--autoscale needs the SLO it scales for: --autoscale-ttft S and --autoscale-tpot S")
        try:
            ranges = parse_autoscale(self.autoscale, self.started_roles())
            config = AutoscaleConfig(ranges, self.autoscale_ttft_s, self.autoscale_tpot_s,
                                     attainment=self.autoscale_attainment, window_s=self.autoscale_window_s,
                                     **self.autoscale_options)
        except AutoscaleConfigError as e:
            raise ServeConfigError(str(e)) from None
        except TypeError as e:   # an unknown option
            raise ServeConfigError(f"autoscale options: {e}") from None
        started = {Role.PREFILL: self.prefill_nodes, Role.DECODE: self.decode_nodes, Role.MIXED: self.mixed_nodes,
                   Role.FLEX: self.prefill_nodes + self.decode_nodes}
        for r in ranges:
            if not r.least <= started[r.role] <= r.most:
                raise ServeConfigError(f"--autoscale {r}: the pool starts {started[r.role]} {r.role} node(s), "
                                       f"outside that range")
            if r.least < 1:
                raise ServeConfigError(f"--autoscale {r}: at least one {r.role} node must stay (MIN >= 1)")
        return config

    def most_nodes(self) -> tuple[int, int, int]:
        """(prefill, decode, mixed) nodes at most: the started counts, or a scaled role's MAX (flex:
        the MAX less the decode nodes started counts as prefill, the node counts' split)."""
        config = self.autoscale_config() if self.autoscale is not None else None
        prefill, decode, mixed = self.prefill_nodes, self.decode_nodes, self.mixed_nodes
        if config is None:
            return prefill, decode, mixed
        for r in config.ranges:
            if r.role is Role.PREFILL:
                prefill = r.most
            elif r.role is Role.DECODE:
                decode = r.most
            elif r.role is Role.MIXED:
                mixed = r.most
            elif r.role is Role.FLEX:
                prefill = r.most - decode
        return prefill, decode, mixed

    @property
    def namespace(self) -> str:
        """The Ray namespace of this deployment's Conductor and node actors."""
        return app_namespace(self.app_name, self.deployment_id)

    def cluster_spec(self) -> ClusterSpec:
        return ClusterSpec(prefill_nodes=self.prefill_nodes, decode_nodes=self.decode_nodes,
                           mixed_nodes=self.mixed_nodes, model=self.model, engine_options=dict(self.engine_options),
                           transfer_options=dict(self.transfer_options), cpus_per_node=self.cpus_per_node,
                           gpus_per_node=self.gpus_per_node, place_by_role=self.place_by_role, name_prefix=self.app_name,
                           namespace=self.namespace, policy=self.policy, topology_file=self.topology,
                           max_node_restarts=self.max_node_restarts,
                           data_plane_secret=self.secret, chaos_hooks=self.chaos_hooks,
                           local_prefill_budget=self.local_prefill_budget if self.adaptive else None,
                           flex=self.adaptive, tpot_target_s=self.tpot_target_s if self.adaptive else None,
                           conductor_options={} if self.ttft_slo_s is None else {"ttft_slo_s": self.ttft_slo_s})
