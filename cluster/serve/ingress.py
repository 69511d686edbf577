"""OpenAIIngress: the Serve deployment in front of the cluster. Each replica builds its own
tokenizer, RequestDriver, circuit breaker and router over the NodePool's current membership (a
NodeSet it refreshes), and its own FastAPI app
(late-bound through `__serve_build_asgi_app__`, so the app can close over this replica's state).
Replicas share nothing but the nodes, so any number of them can run side by side.
"""
from __future__ import annotations

import asyncio

from ray import serve

from raypd.cluster.autoscale.slo_counts import SloTally
from raypd.cluster.autoscale.slo_reporter import SloReporter
from raypd.cluster.client.breaker import CircuitBreaker
from raypd.cluster.client.make_router import make_router
from raypd.cluster.client.node_set import NodeSet
from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.launch.gpu_budget import cluster_gpus
from raypd.cluster.openai.metrics import IngressMetrics
from raypd.cluster.openai.params import ModelLimits
from raypd.cluster.serve.admission import AdmissionGate
from raypd.cluster.serve.app import build_app
from raypd.cluster.serve.config import ServeConfig
from raypd.cluster.serve.generation import Generator
from raypd.cluster.serve.service import OpenAIService
from raypd.engine.model.config import ModelConfig
from raypd.engine.model.source import resolve_model
from raypd.engine.tokenizer import Tokenizer


@serve.deployment(ray_actor_options={"num_cpus": 0},
                  # Streams are long-lived and cheap here (the nodes do the work): the default of 5
                  # would queue the sixth stream at the proxy behind whole generations. The app
                  # sets these above the replica's own AdmissionGate (serve_app.py).
                  max_ongoing_requests=1024, graceful_shutdown_timeout_s=30)
@serve.ingress()
class OpenAIIngress:
    async def __init__(self, config: ServeConfig, node_pool):  # type: ignore[misc]  # Serve awaits it
        self.config = config
        model_dir = await asyncio.to_thread(resolve_model, config.model)
        tokenizer = await asyncio.to_thread(Tokenizer, model_dir)
        model = ModelConfig.from_folder(model_dir)
        membership = await node_pool.membership.remote()
        nodes = [m.node for m in membership.members]
        # The shape of the nodes from those that answer (a replica may start while one is restarting).
        infos = await asyncio.gather(*(n.actor.ready.remote() for n in membership.live()), return_exceptions=True)
        block_size = next(i["block_size"] for i in infos if isinstance(i, dict))
        limits = ModelLimits(
            name=config.model_name(), context_len=model.max_position_embeddings, vocab_size=model.vocab_size,
            block_size=block_size,
            decode_kv_tokens=min(n.num_blocks * block_size for n in nodes if n.role.serves_decode),
            prefill_kv_tokens=min(n.num_blocks * block_size for n in nodes if n.role.serves_prefill),
            default_max_tokens=config.default_max_tokens)
        # The node set follows the pool's supervisor: restarted nodes' new handles, dead nodes out.
        self.node_set = NodeSet(membership, node_pool.membership.remote)  # a Serve handle: Serve's own calls
        self.node_set.start()
        driver = RequestDriver(chunk_timeout_s=config.chunk_timeout_s)
        self.driver = driver
        # A node the pool finds hung or gone: its streams here end now and are replayed elsewhere.
        self.node_set.on_leave(lambda name, state: driver.fail_node(name, f"node {name} is {state.value}"))
        router = make_router(membership.conductor, self.node_set, route_timeout_s=config.route_timeout_s)
        breaker = CircuitBreaker(config.breaker_failures, config.breaker_window_s, config.breaker_cooldown_s)
        self.node_set.on_restart(breaker.forget)  # a new incarnation starts with a clean record
        self.metrics = IngressMetrics()
        self.slo_reporter: SloReporter | None = None
        if (scaling := config.autoscale_config()) is not None:   # the pool scales by what requests see here
            self.metrics.slo = SloTally(scaling.ttft_target_s, scaling.tpot_target_s)
            self.slo_reporter = SloReporter(self.metrics.slo, node_pool.report_slo.remote, every_s=scaling.tick_s)
            self.slo_reporter.start()
        generator = Generator(driver, router, tokenizer.hf, retry_limit=config.retry_limit,
                              migration_limit=config.migration_limit, breaker=breaker, nodes=self.node_set,
                              recovery_wait_s=config.recovery_wait_s, metrics=self.metrics.failover)
        self.service = OpenAIService(tokenizer, limits, generator, self.node_set)
        self.gate = AdmissionGate(*config.admission_limits(cluster_gpus()))
        self.replica = serve.get_replica_context().replica_id.unique_id

    def __serve_build_asgi_app__(self):
        return build_app(self.service, self.config.key_ring(), self.config.max_body_bytes, self.replica,
                         gate=self.gate, request_timeout_s=self.config.request_timeout_s, metrics=self.metrics,
                         tenant_fairness=self.config.tenant_fairness)

    def __del__(self):
        node_set = getattr(self, "node_set", None)
        if node_set is not None:
            node_set.stop()
        reporter = getattr(self, "slo_reporter", None)
        if reporter is not None:
            reporter.stop()
        # The driver owns a socket the nodes send tokens to; Serve calls this when the replica stops.
        close = getattr(getattr(self, "driver", None), "close", None)
        if close is not None:
            close()
