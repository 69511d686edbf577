"""`raypd serve`: Ray, the node actors and the OpenAI endpoint, in one command.

With no arguments: a local Ray instance, 1 prefill + 1 decode node on CPU with the embedded SmolLM2
through NIXL, the endpoint on http://127.0.0.1:8000/v1. It runs until Ctrl-C or SIGTERM, then
stops Serve (the NodePool's shutdown stops the nodes), kills any actor of the app still alive (the
nodes and the Conductor are detached: cluster/serve/node_pool.py) and stops Ray. A bad option, a
port in use or a missing model ends it with one line on stderr and status 2.

    start:  check options, port, model -> ray.init -> serve.start(host, port) -> deploy the app,
            until it is RUNNING
    stop:   serve.shutdown (local) | serve.delete(app) (joined cluster) -> kill what is left in the
            app's namespace -> ray.shutdown -> exit

Nothing in either waits longer than the thing it waits for: Serve's own waits poll once a second
(deploy, delete), so the app's status is polled here every APP_POLL_S instead; its replicas stop
without Serve's 2 s drain pause when no request is in flight (serve_app.py); a local Ray stops
without the second its autoscaler monitor takes to die (ray_init.stop_ray); and once everything is
stopped the process ends without the interpreter's tear-down of its heap (seconds on a small machine).
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, NoReturn

from raypd.cluster.cli.engine_args import add_engine_args, engine_options
from raypd.cluster.cli.transfer_args import add_transfer_args, transfer_options
from raypd.cluster.launch.gpu_budget import cluster_gpus
from raypd.cluster.launch.ray_init import init_ray, reason, stop_ray

if TYPE_CHECKING:  # it imports Ray, which the command line loads only once it starts serving
    from raypd.cluster.serve.config import ServeConfig

log = logging.getLogger("raypd.serve")
STACKS_AFTER_S = 45.0  # a clean-up still running this long after Ctrl-C is stuck: its stacks are logged
APP_POLL_S = 0.25     # how often the app's status is read while it deploys or is deleted (~10 ms of CPU each)
DELETE_TIMEOUT_S = 60.0   # as serve.delete's own wait


class ServeStartError(RuntimeError):
    """raypd serve cannot start; the message is the one line the user sees."""


class ShutdownRequested(BaseException):
    """Raised in the main thread by the SIGINT/SIGTERM handler; BaseException so that no
    `except Exception` on the way swallows it."""


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible API on a Ray cluster of prefill/decode nodes")
    p.add_argument("--model", help="Hugging Face model folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--served-model-name", help="the model id clients send (default: from the model path)")
    p.add_argument("--prefill-nodes", type=int, default=None, help="default 1 (0 with --mixed-nodes)")
    p.add_argument("--decode-nodes", type=int, default=None, help="default 1 (0 with --mixed-nodes)")
    p.add_argument("--mixed-nodes", type=int, default=0, help="colocated prefill+decode nodes instead of PD")
    p.add_argument("--gpus-per-node", type=float, default=None,
                   help="GPUs per node actor, at most 1 (no tensor parallelism); default: 1 where Ray reports GPUs, else 0")
    p.add_argument("--cpus-per-node", type=float, default=1.0, help="Ray CPUs per node actor (= torch threads)")
    p.add_argument("--place-by-role", action="store_true",
                   help="put each node actor on a Ray node labelled raypd.io/role=<its role> (cluster.yaml, Helm)")
    p.add_argument("--policy", default="cost", help="the Conductor's routing policy (default: cost)")
    p.add_argument("--topology", help="network topology file for the Conductor")
    p.add_argument("--adaptive", action="store_true",
                   help="adaptive disaggregation: the PD nodes start as flex nodes whose duty (prefill or "
                        "decode) the Conductor's planner moves as the load shifts, and per request the Conductor "
                        "chooses the split path or lets the decode node prefill the prompt itself (short or "
                        "mostly cached prompts, a long prefill queue)")
    p.add_argument("--local-prefill-budget", type=int, default=32, metavar="TOKENS",
                   help="with --adaptive: prompt tokens a decode node computes per step while it decodes, so "
                        "its running requests keep their TPOT (default 32, sized for a CPU core; a GPU node "
                        "takes a few hundred)")
    p.add_argument("--tpot-target", type=float, default=None, metavar="S",
                   help="with --adaptive: the TPOT to hold, in seconds; decode steps slower than 0.8 S move a "
                        "node to decode (default: only decode KV memory does)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require this bearer key (default: $RAYPD_API_KEY; none if unset)")
    p.add_argument("--api-keys-file", default=None, metavar="PATH",
                   help="accept these keys, each with its tenant and default priority (YAML: keys: [{key, tenant, "
                        "priority}]); with --api-key, both are accepted")
    p.add_argument("--no-tenant-fairness", dest="tenant_fairness", action="store_false",
                   help="tenants do not share the ingress's line and the nodes' waiting queues by tokens served: "
                        "every request counts as one tenant's, so both order by priority, then arrival (for "
                        "comparing against fairness, on by default; raypd bench tenants)")
    p.add_argument("--address", help="join this Ray cluster (e.g. auto) instead of starting a local one")
    p.add_argument("--ingress-replicas", type=int, default=1)
    p.add_argument("--max-body-bytes", type=int, default=4 << 20)
    p.add_argument("--default-max-tokens", type=int, default=None,
                   help="output cap for requests that set none (default: the rest of the context)")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                   help="a request's total deadline from its arrival; then 504 (an error event in a stream) "
                        "and its work on the nodes is aborted (default 600)")
    p.add_argument("--no-dashboard", action="store_true", help="do not start the Ray dashboard (local Ray only)")
    p.add_argument("--metrics-export-port", type=int, default=None,
                   help="Ray's Prometheus endpoint port, e.g. 8080: not in 10002-19999 (local Ray only)")
    add_transfer_args(p)
    p.add_argument("--max-node-restarts", type=int, default=10,
                   help="Ray restarts a node actor that died up to this many times (default 10; 0: never)")
    p.add_argument("--retry-limit", type=int, default=3,
                   help="re-routes of a request whose node failed before its first token (default 3)")
    p.add_argument("--migration-limit", type=int, default=3,
                   help="replays of a request whose decode node failed mid-stream, on a live pair (default 3)")
    p.add_argument("--chaos-hooks", action="store_true",
                   help="let callers crash a node's engine or fail its requests (crash_engine, fail_requests): "
                        "for chaos tests and `raypd bench chaos` only, never in production")
    p.add_argument("--stall-timeout", type=float, default=60.0,
                   help="seconds one engine step may run before its node counts as hung and leaves routing "
                        "until the step ends (default 60; probes never wait for a step)")
    p.add_argument("--recovery-wait", type=float, default=60.0,
                   help="seconds a request that finds no live node waits for a restarting one before 503 "
                        "(default 60; 0: answer 503 at once)")
    b = p.add_argument_group("back-pressure (full: 429 with Retry-After; nodes: --max-waiting-requests)")
    b.add_argument("--max-ongoing-requests", type=int, default=None,
                   help="per ingress replica: generation requests in progress (default: what the decode or mixed "
                        "nodes hold, running + waiting, shared among the replicas)")
    b.add_argument("--max-queued-requests", type=int, default=None,
                   help="per ingress replica: requests waiting for one of those slots (default: as many again)")
    b.add_argument("--ttft-slo", type=float, default=None, metavar="S",
                   help="turn on the Conductor's SLO admission: reject a request whose estimated TTFT exceeds S s")
    a = p.add_argument_group("autoscaling (the node pool follows the SLO; docs/architecture.md, \"Autoscaling\")")
    a.add_argument("--autoscale", default=None, metavar="RANGES",
                   help="scale the node pool between MIN and MAX nodes: MIN:MAX for every started role, or "
                        "role=MIN:MAX[,role=MIN:MAX] (prefill, decode, mixed; flex with --adaptive). The node "
                        "counts above are where it starts. Nodes are added as Ray resource requests (a Ray "
                        "autoscaler or KubeRay brings machines) and removed after draining, losing no request")
    a.add_argument("--autoscale-ttft", type=float, default=None, metavar="S",
                   help="with --autoscale: the TTFT target a request must meet (seconds)")
    a.add_argument("--autoscale-tpot", type=float, default=None, metavar="S",
                   help="with --autoscale: the time per output token a request must meet (seconds)")
    a.add_argument("--autoscale-attainment", type=float, default=0.9, metavar="SHARE",
                   help="with --autoscale: the share of requests that must meet both targets (default 0.9)")
    a.add_argument("--autoscale-window", type=float, default=30.0, metavar="S",
                   help="with --autoscale: attainment is judged over the requests of the last S seconds (default 30)")
    a.add_argument("--autoscale-option", action="append", default=[], metavar="NAME=VALUE",
                   help="with --autoscale: one of the scaler's finer settings (cluster/autoscale/config.py's "
                        "AutoscaleConfig: up_hold_s, up_cooldown_s, down_hold_s, down_cooldown_s, idle_share, "
                        "queue_per_node, min_samples, tick_s, drain_timeout_s, ...); repeatable")
    add_engine_args(p)
    p.set_defaults(run=run_serve)


def config_from_args(args):
    from raypd.cluster.serve.config import ServeConfig

    pd_default = 0 if args.mixed_nodes else 1
    return ServeConfig(
        model=args.model, served_model_name=args.served_model_name,
        prefill_nodes=pd_default if args.prefill_nodes is None else args.prefill_nodes,
        decode_nodes=pd_default if args.decode_nodes is None else args.decode_nodes,
        mixed_nodes=args.mixed_nodes, cpus_per_node=args.cpus_per_node, gpus_per_node=args.gpus_per_node,
        place_by_role=args.place_by_role, engine_options=engine_options(args), transfer_options=transfer_options(args), policy=args.policy,
        topology=args.topology, api_key=args.api_key or os.environ.get("RAYPD_API_KEY") or None,
        api_keys_file=args.api_keys_file, tenant_fairness=args.tenant_fairness,
        max_body_bytes=args.max_body_bytes, default_max_tokens=args.default_max_tokens,
        request_timeout_s=args.request_timeout,
        ingress_replicas=args.ingress_replicas, max_node_restarts=args.max_node_restarts,
        retry_limit=args.retry_limit, migration_limit=args.migration_limit, recovery_wait_s=args.recovery_wait,
        stall_timeout_s=args.stall_timeout, chaos_hooks=args.chaos_hooks,
        max_ongoing_requests=args.max_ongoing_requests, max_queued_requests=args.max_queued_requests,
        ttft_slo_s=args.ttft_slo, adaptive=args.adaptive, local_prefill_budget=args.local_prefill_budget,
        tpot_target_s=args.tpot_target, autoscale=args.autoscale, autoscale_ttft_s=args.autoscale_ttft,
        autoscale_tpot_s=args.autoscale_tpot, autoscale_attainment=args.autoscale_attainment,
        autoscale_window_s=args.autoscale_window, autoscale_options=autoscale_options(args.autoscale_option))


def autoscale_options(items: list[str]) -> dict:
    """--autoscale-option NAME=VALUE pairs as AutoscaleConfig fields (numbers; ServeConfig checks the names)."""
    from raypd.cluster.serve.config import ServeConfigError

    out: dict = {}
    for item in items:
        name, eq, value = item.partition("=")
        try:
            if not eq:
                raise ValueError
            out[name.strip()] = int(value) if value.strip().lstrip("-").isdigit() else float(value)
        except ValueError:
            raise ServeConfigError(f"--autoscale-option {item!r}: expected NAME=NUMBER") from None
    return out


def check_port_free(host: str, port: int) -> None:
    """Fail before starting anything: Serve would otherwise start and then fail deep inside its proxy."""
    if not 0 < port < 65536:
        raise ServeStartError(f"--port {port} is out of range")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the proxy binds: TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as e:
            reason = "is already in use" if e.errno in (98, 48) else f"cannot be bound ({e.strerror})"
            raise ServeStartError(f"{host}:{port} {reason}; pick another with --port") from None


def check_serve_http(host: str, port: int, running) -> None:
    """Serve fixes its HTTP proxies' host and port when it first starts on a Ray cluster and ignores
    them afterwards (with a warning in Serve's log only). Joining a cluster whose Serve already runs
    elsewhere, this raypd would print an endpoint nobody listens on: fail, naming the one in use.
    `running`: the running Serve's HTTPOptions."""
    if (running.host, running.port) != (host, port):
        raise ServeStartError(
            f"Serve already runs on this Ray cluster with its HTTP endpoint on {running.host}:{running.port}, "
            f"and keeps it for as long as it runs: pass --host {running.host} --port {running.port}, or stop "
            f"Serve first (`serve shutdown`)")


def check_metrics_port(port: int | None) -> None:
    # Ray gives workers ports 10002-19999; an export port in that range makes Ray fail to start.
    if port is not None and not (0 < port < 10002 or 19999 < port < 65536):
        raise ServeStartError(f"--metrics-export-port {port} is in Ray's worker port range 10002-19999")


def run_serve(args) -> int:
    logging.basicConfig(level=logging.INFO, format="raypd serve: %(message)s", stream=sys.stderr)
    from raypd.cluster.serve.config import ServeConfigError
    from raypd.engine.errors import EngineError
    from raypd.engine.model.source import resolve_model

    try:
        config = config_from_args(args)
        keys = config.key_ring()  # a bad keys file: one line now, not a replica that fails to start
        check_port_free(args.host, args.port)
        check_metrics_port(args.metrics_export_port)
        resolve_model(config.model)  # model not found -> one line now; converts a GGUF once, for every process
    except (ServeConfigError, ServeStartError, EngineError) as e:
        print(f"raypd serve: error: {e}", file=sys.stderr)
        return 2
    if keys is not None:
        log.info("API keys: %d (%r)", len(keys), keys)
    server = Server(config, args)
    _handle_signals()
    code = 0
    try:
        server.start()
        while True:
            time.sleep(3600)
    except (ShutdownRequested, KeyboardInterrupt):
        log.info("shutting down")
    except ServeStartError as e:
        print(f"raypd serve: error: {e}", file=sys.stderr)
        code = 2
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # Every step of the clean-up is bounded (Serve's controller 30 s, Ray's kills); should one hang
        # anyway, every thread's stack goes to stderr, repeatedly, so that the operator (and a test's
        # log) sees where. Never cancelled: the exit ends it.
        faulthandler.dump_traceback_later(STACKS_AFTER_S, repeat=True, file=sys.stderr)
        server.stop()
    _exit(code)


def _exit(code: int) -> NoReturn:
    """End the process now that everything it started is stopped (Ray disconnected and, if started
    here, stopped): the interpreter's own tear-down (collecting and freeing Ray's, Serve's and
    FastAPI's objects) took 1-4 s on a 2-core machine and has nothing left to release outside this
    process. The log is flushed first; the atexit hooks it skips are Ray's shutdown, already done."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Server:
    """The Ray / Serve lifecycle of one `raypd serve` process."""

    def __init__(self, config: ServeConfig, args: argparse.Namespace):
        self.config = config
        self.args = args
        self.started_ray = False

    def start(self) -> None:
        import ray
        from ray import serve

        from raypd.cluster.serve_app import build_serve_app

        ctx = self._init_ray()
        _handle_signals()  # ray.init installs its own SIGTERM handler, which would skip our clean-up
        if self.config.place_by_role:
            from raypd.cluster.launch.placement import NoControlPlaneMachine, check_control_plane_machine
            try:
                check_control_plane_machine(ray.nodes())
            except NoControlPlaneMachine as e:
                raise ServeStartError(str(e)) from None
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        serve.start(http_options={"host": self.args.host, "port": self.args.port})
        # The controller's own HTTP options (Ray has no public getter): those of the Serve now running.
        from ray.serve.context import _get_global_client
        client = _get_global_client()
        if client is not None:   # serve.start() just connected it; None would mean Serve changed this
            check_serve_http(self.args.host, self.args.port, client.http_config)
        nodes = self.config.prefill_nodes + self.config.decode_nodes + self.config.mixed_nodes
        log.info("starting %d node(s) and %d ingress replica(s) ...", nodes, self.config.ingress_replicas)
        try:
            self._deploy(build_serve_app(self.config))
        except RuntimeError as e:
            raise ServeStartError(f"the application failed to deploy: {reason(e)}") from None
        pool = serve.get_deployment_handle("NodePool", app_name=self.config.app_name)
        nodes = pool.nodes.remote().result()
        layout = (f"{self.config.mixed_nodes} mixed" if self.config.mixed_nodes else
                  f"{self.config.prefill_nodes} prefill + {self.config.decode_nodes} decode")
        log.info("nodes: %s (%s); policy %s", ", ".join(n.name for n in nodes), layout, self.config.policy)
        if (scaling := self.config.autoscale_config()) is not None:
            log.info("autoscaling %s for TTFT <= %g s and TPOT <= %g s in %.0f%% of the requests of the last %g s",
                     ", ".join(map(str, scaling.ranges)), scaling.ttft_target_s, scaling.tpot_target_s,
                     100 * scaling.attainment, scaling.window_s)
        ongoing, queued = self.config.admission_limits(cluster_gpus())
        slo = f"TTFT <= {self.config.ttft_slo_s:g} s" if self.config.ttft_slo_s else "off"
        log.info("back-pressure (429 beyond): %d requests in progress + %d queued per ingress replica; "
                 "SLO admission %s; tenant fairness %s", ongoing, queued, slo,
                 "on" if self.config.tenant_fairness else "off")
        log.info("OpenAI endpoint: http://%s:%d/v1  (model %r%s)", _url_host(self.args.host), self.args.port,
                 self.config.model_name(), ", API key required" if self.config.api_key or self.config.api_keys_file
                 else "")
        dashboard = getattr(ctx, "dashboard_url", None)
        log.info("Ray dashboard: %s", f"http://{dashboard}" if dashboard else "not running")
        gcs = (getattr(ctx, "address_info", None) or {}).get("gcs_address")
        if gcs:
            log.info("Ray cluster: %s", gcs)
        if self.args.metrics_export_port and self.started_ray:
            log.info("Prometheus metrics: http://127.0.0.1:%d/metrics", self.args.metrics_export_port)
        log.info("ready; Ctrl-C stops everything")

    def _deploy(self, app) -> None:
        """serve.run(app), polling the app's status every APP_POLL_S rather than Serve's every second:
        returns once it is RUNNING, raises RuntimeError with Serve's message if it fails to deploy."""
        from ray import serve

        name = self.config.app_name
        serve.run_many([serve.RunTarget(app, name=name, route_prefix="/")], wait_for_applications_running=False)
        while True:
            app_status = serve.status().applications.get(name)
            if app_status is None:
                raise RuntimeError(f"the application {name} is gone")
            if app_status.status == "RUNNING":
                return
            if app_status.status == "DEPLOY_FAILED":
                raise RuntimeError(f"Deploying application {name} failed: {app_status.message}")
            time.sleep(APP_POLL_S)

    def _delete(self) -> None:
        """serve.delete(app), polling as _deploy does, until the app is gone (TimeoutError after
        DELETE_TIMEOUT_S, as serve.delete's own wait)."""
        from ray import serve

        name = self.config.app_name
        serve.delete(name, _blocking=False)
        deadline = time.monotonic() + DELETE_TIMEOUT_S
        while (app := serve.status().applications.get(name)) is not None and app.status != "NOT_STARTED":
            if time.monotonic() > deadline:
                raise TimeoutError(f"the application {name} was not deleted within {DELETE_TIMEOUT_S:.0f}s")
            time.sleep(APP_POLL_S)

    def _init_ray(self):
        c = self.config
        need = sum(c.most_nodes()) * c.cpus_per_node + c.ingress_cpus * c.ingress_replicas   # room to scale up
        local = {"include_dashboard": not self.args.no_dashboard, "dashboard_host": "127.0.0.1"}
        if self.args.metrics_export_port:
            local["_metrics_export_port"] = self.args.metrics_export_port
        ctx, self.started_ray = init_ray(self.args.address, need, local_options=local, namespace="raypd",
                                         log_to_driver=False, logging_level=logging.WARNING)
        return ctx

    def stop(self) -> None:
        import ray
        from ray import serve

        from raypd.cluster.launch.named_actors import kill_namespace

        if not ray.is_initialized():
            return
        log.info("stopping Serve ...")
        try:
            if self.started_ray:
                serve.shutdown()
            else:  # a shared cluster: remove only our application (its NodePool stops our nodes)
                self._delete()
        except Exception as e:  # noqa: BLE001 - keep going: the nodes and Ray must still stop
            log.warning("stopping Serve failed: %s", reason(e))
        try:   # normally gone with the NodePool; not if its replica was down when the app went
            if left := kill_namespace(self.config.namespace):
                log.warning("killed what the app left running: %s", ", ".join(left))
        except Exception as e:  # noqa: BLE001 - Ray must still stop
            log.warning("could not kill the app's actors: %s", reason(e))
        log.info("stopping Ray ...")
        stop_ray(self.started_ray)
        log.info("stopped")


def _handle_signals() -> None:
    def on_signal(signum, _frame):
        raise ShutdownRequested(signal.Signals(signum).name)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
