"""OpenAIIngress: the Serve deployment in front of the cluster. Each replica builds its own
tokenizer, RequestDriver and router over the NodePool's node actors, and its own FastAPI app
(late-bound through `__serve_build_asgi_app__`, so the app can close over this replica's state).
Replicas share nothing but the nodes, so any number of them can run side by side.
"""
from __future__ import annotations

import asyncio

from ray import serve

from raypd.cluster.client.make_router import make_router
from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.openai.params import ModelLimits
from raypd.cluster.serve.app import build_app
from raypd.cluster.serve.config import ServeConfig
from raypd.cluster.serve.generation import Generator
from raypd.cluster.serve.service import OpenAIService
from raypd.engine.model.config import ModelConfig
from raypd.engine.model.source import resolve_model
from raypd.engine.tokenizer import Tokenizer


@serve.deployment(ray_actor_options={"num_cpus": 0},
                  # Streams are long-lived and cheap here (the nodes do the work): the default of 5
                  # would queue the sixth stream at the proxy behind whole generations.
                  max_ongoing_requests=1024, graceful_shutdown_timeout_s=30)
@serve.ingress()
class OpenAIIngress:
    async def __init__(self, config: ServeConfig, node_pool):  # type: ignore[misc]  # Serve awaits it
        self.config = config
        model_dir = await asyncio.to_thread(resolve_model, config.model)
        tokenizer = await asyncio.to_thread(Tokenizer, model_dir)
        model = ModelConfig.from_folder(model_dir)
        nodes = await node_pool.nodes.remote()
        infos = await asyncio.gather(*(n.actor.ready.remote() for n in nodes))
        capacity = {n.name: info["num_blocks"] * info["block_size"] for n, info in zip(nodes, infos)}
        limits = ModelLimits(
            name=config.model_name(), context_len=model.max_position_embeddings, vocab_size=model.vocab_size,
            block_size=infos[0]["block_size"],
            decode_kv_tokens=min(capacity[n.name] for n in nodes if n.role.serves_decode),
            prefill_kv_tokens=min(capacity[n.name] for n in nodes if n.role.serves_prefill),
            default_max_tokens=config.default_max_tokens)
        driver = RequestDriver(chunk_timeout_s=config.chunk_timeout_s)
        self.driver = driver
        router = make_router(await node_pool.conductor.remote(), nodes)
        self.service = OpenAIService(tokenizer, limits, Generator(driver, router, tokenizer.hf), nodes)
        self.replica = serve.get_replica_context().replica_id.unique_id

    def __serve_build_asgi_app__(self):
        return build_app(self.service, self.config.api_key, self.config.max_body_bytes, self.replica)

    def __del__(self):
        # The driver owns a socket the nodes send tokens to; Serve calls this when the replica stops.
        close = getattr(getattr(self, "driver", None), "close", None)
        if close is not None:
            close()
