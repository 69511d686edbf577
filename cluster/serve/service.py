"""What each endpoint does, independent of FastAPI and of Serve: turn a validated request into
prompts and sampling parameters, run it, render the answer. One instance per ingress replica.

Every generation request runs against its deadline (event-loop time, set where the request arrived:
see guard.py): preparing the prompts, routing, and every event after. When it passes, the request's
streams close, which aborts its work on both nodes, and the client gets a 504 (or, once a stream has
begun, an error event and [DONE]).
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict

from fastapi.responses import JSONResponse, Response, StreamingResponse

from raypd.cluster.client.node_handles import NodeHandle
from raypd.cluster.client.node_set import NodeSet
from raypd.cluster.openai.api_errors import BadRequest, ServiceUnavailable
from raypd.cluster.openai.deadline import until
from raypd.cluster.openai.metrics import RequestRecord, track
from raypd.cluster.openai.params import ModelLimits, PreparedRequest, check_generations, check_supported, prepare
from raypd.cluster.openai.prompts import PromptBuilder
from raypd.cluster.openai.render import Kind, Renderer
from raypd.cluster.openai.request_schema import ChatCompletionRequest, CompletionRequest
from raypd.cluster.openai.response_schema import ModelCard, ModelList
from raypd.cluster.serve.generation import Generator
from raypd.engine.tokenizer import Tokenizer

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}  # no proxy may buffer the stream


class OpenAIService:
    def __init__(self, tokenizer: Tokenizer, limits: ModelLimits, generator: Generator,
                 nodes: NodeSet | list[NodeHandle], prompts: PromptBuilder | None = None):
        self.tokenizer = tokenizer
        self.prompts = prompts or PromptBuilder(tokenizer, limits)
        self.limits = limits
        self.generator = generator
        self.nodes = NodeSet.of(nodes)
        self.created = int(time.time())

    async def chat(self, req: ChatCompletionRequest, rec: RequestRecord | None = None,
                   deadline: float | None = None, tenant: str = "") -> Response:
        """tenant: whose request this is (the caller's, cluster/openai/api_keys.py), for the nodes' fair share."""
        self._check(req)
        check_generations(req, 1)
        ids = await until(deadline, self.prompts.chat(req))
        return await self._respond("chat", "chatcmpl", req, prepare(req, [ids], self.limits, tenant), rec=rec,
                                   deadline=deadline)

    async def completions(self, req: CompletionRequest, rec: RequestRecord | None = None,
                          deadline: float | None = None, tenant: str = "") -> Response:
        self._check(req)
        items = _as_list(req.prompt)
        if not items:
            raise BadRequest("the prompt is empty", "prompt")
        check_generations(req, len(items))
        prompts = await until(deadline, self.prompts.completion(items))
        prepared = prepare(req, prompts, self.limits, tenant)
        echo = None
        if req.echo:
            ids_only = [ids for p, ids in zip(items, prompts) if not isinstance(p, str)]
            decoded = iter(await until(deadline, self.prompts.decode(ids_only)) if ids_only else [])
            echo = [p if isinstance(p, str) else next(decoded) for p in items]
        return await self._respond("completion", "cmpl", req, prepared, echo, rec, deadline)

    def models(self) -> dict:
        card = ModelCard(id=self.limits.name, created=self.created, max_model_len=self.limits.context_len)
        return ModelList(data=[card]).model_dump(mode="json")

    def health(self) -> tuple[bool, dict]:
        """Readiness: (True, body) while a request can be served (a live node of every role it needs);
        the body lists each node's state and the Conductor's either way."""
        membership = self.nodes.membership
        return membership.can_serve, {**membership.health(), "model": self.limits.name}

    @staticmethod
    def liveness() -> dict:
        """Liveness: this process answers; whether the cluster can serve is readiness's question."""
        return {"status": "alive"}

    async def node_status(self, timeout_s: float = 10.0) -> dict:
        """Per node: what it still holds (check_idle: zeros when idle), its load and its transfer stats
        (a prefill node's names the transports its writes took); for operators and for tests that
        prove a disconnect freed everything."""
        async def one(n: NodeHandle) -> dict:
            try:
                idle, load, stats = await asyncio.wait_for(asyncio.gather(
                    n.actor.check_idle.remote(), n.actor.load_report.remote(), n.actor.stats.remote()), timeout_s)
                return {"name": n.name, "role": n.role, "host": n.host.hostname, "pid": n.host.pid, "held": idle,
                        "idle": not any(idle.values()), "load": asdict(load),
                        "breaker": self.generator.breaker.state(n.name).name.lower(),
                        "transfer": stats.get("transfer")}   # its endpoint's rooms and, when on, transports
            except Exception as e:  # noqa: BLE001 - report the node as failing, keep the others
                return {"name": n.name, "role": n.role, "host": n.host.hostname, "pid": n.host.pid,
                        "error": f"{type(e).__name__}: {e}"}
        return {"nodes": await asyncio.gather(*(one(n) for n in self.nodes.all()))}

    # -- helpers ----------------------------------------------------------------------------------------
    def _check(self, req: ChatCompletionRequest | CompletionRequest) -> None:
        check_supported(req, self.limits)
        if req.stream_options is not None and not req.stream:
            raise BadRequest("stream_options is only allowed when stream is true", "stream_options")

    async def _respond(self, kind: Kind, prefix: str, req, prepared: PreparedRequest,
                       echo: list[str] | None = None, rec: RequestRecord | None = None,
                       deadline: float | None = None) -> Response:
        rid = f"{prefix}-{uuid.uuid4().hex}"
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        renderer = Renderer(kind, rid, self.limits.name, int(time.time()), [len(p) for p in prepared.prompts],
                            req.n, include_usage)
        events = track(rec, self.generator.run(rid, prepared, echo, deadline), prepared, echo)  # metrics, if recorded
        if not req.stream:
            return JSONResponse(await renderer.collect(events))
        # Wait for the first event before answering, so routing and early node failures still get
        # their HTTP status (429, 503) instead of an error inside a 200 stream.
        try:
            first = await anext(events)
        except StopAsyncIteration:
            raise ServiceUnavailable("the cluster produced no output", code="node_failure") from None
        except BaseException:
            await events.aclose()
            raise
        return StreamingResponse(renderer.sse(first, events), media_type="text/event-stream", headers=SSE_HEADERS)


def _as_list(prompt) -> list:
    """The OpenAI prompt forms as a list of prompts: str | [str] | [int] | [[int]]."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)
