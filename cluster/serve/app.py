"""The FastAPI app of one ingress replica: the OpenAI routes, the admin route, and the error
handlers that give every failure its OpenAI-style body (never FastAPI's {"detail": ...}, never an
HTML traceback).

    POST /v1/chat/completions   POST /v1/completions   GET /v1/models
    GET  /health, /health/ready readiness: 200 while every role has a live node (body: each node's state)
    GET  /health/live           liveness: the process answers
    GET  /admin/nodes           per node: what it still holds (zeros when idle) and its load
The generation routes pass this replica's AdmissionGate (admission.py): past its bound, 429.
"""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from raypd.cluster.openai.api_errors import APIError, MethodNotAllowed, NotFound, api_error, from_validation_errors
from raypd.cluster.openai.api_keys import KeyRing
from raypd.cluster.openai.guard import GuardMiddleware, caller_of, deadline_of
from raypd.cluster.openai.json_shape import check_json_shape
from raypd.cluster.openai.metrics import IngressMetrics, MetricsMiddleware, record_of
from raypd.cluster.openai.request_schema import ChatCompletionRequest, CompletionRequest
from raypd.cluster.serve.admission import AdmissionGate, AdmissionMiddleware
from raypd.cluster.serve.service import OpenAIService


def build_app(service: OpenAIService, api_key: KeyRing | str | None, max_body_bytes: int, replica: str = "",
              metrics: IngressMetrics | None = None, gate: AdmissionGate | None = None,
              request_timeout_s: float | None = None, tenant_fairness: bool = True) -> FastAPI:
    app = FastAPI(title="raypd", description="OpenAI-compatible endpoint of a raypd cluster")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = with_caller_priority(parse_body(await request.body(), ChatCompletionRequest), request.state)
        return await _guarded(service.chat(body, record_of(request.state), deadline_of(request.state),
                                           caller_of(request.state).tenant))

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = with_caller_priority(parse_body(await request.body(), CompletionRequest), request.state)
        return await _guarded(service.completions(body, record_of(request.state), deadline_of(request.state),
                                                  caller_of(request.state).tenant))

    @app.get("/v1/models")
    async def models():
        return service.models()

    @app.get("/health")
    @app.get("/health/ready")
    async def health():
        ready, body = service.health()
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/health/live")
    async def liveness():
        return service.liveness()

    @app.get("/admin/nodes")
    async def admin_nodes():
        return await service.node_status()

    @app.exception_handler(APIError)
    async def on_api_error(_: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            return NotFound(f"no route {request.url.path}", code="not_found").response()
        if exc.status_code == 405:
            return MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}",
                                    code="method_not_allowed").response()
        err = APIError(str(exc.detail), code="http_error")
        err.status = exc.status_code
        return err.response()

    @app.exception_handler(Exception)
    async def on_unexpected(_: Request, exc: Exception):
        return api_error(exc).response()  # a bug of ours: a 500 with an OpenAI body, the detail in the log

    if gate is not None:  # inside the guard: a refused key or body takes no slot
        app.add_middleware(AdmissionMiddleware, gate=gate)
    app.add_middleware(GuardMiddleware, api_key=api_key, max_body_bytes=max_body_bytes,
                       request_timeout_s=request_timeout_s, tenant_fairness=tenant_fairness)
    if replica:
        app.add_middleware(ReplicaTag, replica=replica)
    # Added last, so outermost: it also counts the requests the guard refuses (401, 413).
    app.add_middleware(MetricsMiddleware, metrics=metrics or IngressMetrics())
    return app


def with_caller_priority(body, state):
    """The request with its API key's default priority (api_keys.py) when it sends none of its own."""
    default = caller_of(state).priority
    return body.model_copy(update={"priority": default}) if body.priority is None and default else body


def parse_body(raw: bytes, model: type[BaseModel]):
    """The body as `model`, whatever Content-Type the client sent (curl -d sends a form type); the
    JSON is parsed by pydantic in strict mode, so wrong types are 400s, never coerced. Parsing holds
    the GIL wherever it runs, so its cost is bounded first (json_shape.py) and it stays on the loop."""
    check_json_shape(raw)
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise from_validation_errors(e.errors(include_url=False)) from None


async def _guarded(call):
    """Await an endpoint's work; any exception becomes its APIError (typed ones keep their status)."""
    try:
        return await call
    except APIError:
        raise
    except Exception as e:  # noqa: BLE001 - api_error() maps typed errors and turns the rest into 500
        raise api_error(e) from e


class ReplicaTag:
    """Adds `x-raypd-replica` to every response: which ingress replica answered (for operators
    and for the tests that check several replicas share the load)."""

    def __init__(self, app, replica: str):
        self.app = app
        self.header = (b"x-raypd-replica", replica.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def tagged_send(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, tagged_send)
