"""The ingress's gate, as plain ASGI middleware in front of FastAPI: the API key (401), the body
size limit (413) and the body's upload time (408), decided before any byte of the body is parsed;
the request's deadline, stamped at arrival into the scope's state (`deadline_of`), and its caller,
the tenant and default priority its key names (api_keys.py; `caller_of`).

The caller's tenant is the one place fairness learns who a request is for: the ingress's line
(admission.py) and, through SamplingParams.tenant, each node's waiting queue. With tenant fairness
off (`raypd serve --no-tenant-fairness`) every caller is stamped with SHARED_TENANT instead, so both
order by priority, then arrival, as they would for one tenant (the header is still checked: a bad one
is a 400 either way, and the key's priority and weight are kept).

A declared Content-Length over the limit is refused without reading; a chunked body is read up to
the limit and refused as soon as it passes it. The accepted body is buffered and replayed to the
app, whose later receive() calls (disconnect detection while streaming) reach the real channel.

A body must arrive within body_timeout_s (and the request's deadline): neither uvicorn nor Ray
Serve's proxy bounds how long an upload may take (the proxy passes the body on message by message
as it comes), so a client sending one byte a second would otherwise hold a request slot of this
replica for as long as it likes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any

from raypd.cluster.openai.api_errors import APIError, BadRequest, PayloadTooLarge, RequestTimeout, Unauthorized
from raypd.cluster.openai.api_keys import ANONYMOUS, Caller, KeyRing
from raypd.cluster.openai.deadline import until

# Probes must work without the key: the Helm chart's readiness and liveness probes send no header.
OPEN_PATHS = frozenset({"/health", "/health/ready", "/health/live"})
# 4 MB (the default body limit) in 30 s is 1.1 Mbit/s: a slow link still makes it, a stalled one not.
BODY_TIMEOUT_S = 30.0
TENANT_HEADER = b"x-raypd-tenant"  # a gateway's name for the end user: the request's tenant (api_keys.py)
TENANT_NAME = re.compile(rb"[A-Za-z0-9._:@-]{1,64}")
DEADLINE_KEY = "raypd_deadline"  # the request's deadline (event-loop time) in the ASGI scope's state
CALLER_KEY = "raypd_caller"      # the request's Caller (its key's tenant and default priority), likewise
SHARED_TENANT = "shared"         # every caller's tenant with tenant fairness off


def deadline_of(state: Any) -> float | None:
    """The deadline GuardMiddleware stamped into a Starlette request.state (None: no deadline)."""
    return getattr(state, DEADLINE_KEY, None)


def caller_of(state: Any) -> Caller:
    """The caller GuardMiddleware stamped into a Starlette request.state (ANONYMOUS: no keys)."""
    return getattr(state, CALLER_KEY, ANONYMOUS)


def caller_in(scope: dict) -> Caller:
    """The same, read from the ASGI scope by middleware inside the guard."""
    return scope.get("state", {}).get(CALLER_KEY, ANONYMOUS)


class GuardMiddleware:
    def __init__(self, app, api_key: KeyRing | str | None, max_body_bytes: int, request_timeout_s: float | None = None,
                 body_timeout_s: float = BODY_TIMEOUT_S, tenant_fairness: bool = True):
        """api_key: the keys accepted (a KeyRing, or one key as a string); None: no key needed.
        tenant_fairness False: every caller's tenant is SHARED_TENANT."""
        self.app = app
        self.tenant_fairness = tenant_fairness
        self.keys = KeyRing.single(api_key) if isinstance(api_key, str) else api_key
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        arrival = asyncio.get_running_loop().time()
        deadline = None if self.request_timeout_s is None else arrival + self.request_timeout_s
        state = scope.setdefault("state", {})
        state[DEADLINE_KEY], state[CALLER_KEY] = deadline, ANONYMOUS
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        try:
            if self.keys is not None and scope.get("path") not in OPEN_PATHS:
                state[CALLER_KEY] = self._check_key(headers.get(b"authorization"), self.keys)
            tenant = headers.get(TENANT_HEADER)
            if tenant is not None:
                if not TENANT_NAME.fullmatch(tenant):
                    raise BadRequest("x-raypd-tenant must be 1-64 letters, digits or ._:@-", code="invalid_header")
                state[CALLER_KEY] = dataclasses.replace(state[CALLER_KEY], tenant=tenant.decode())
            if not self.tenant_fairness:
                state[CALLER_KEY] = dataclasses.replace(state[CALLER_KEY], tenant=SHARED_TENANT)
            if scope.get("method") not in ("POST", "PUT", "PATCH"):
                return await self.app(scope, receive, send)
            body_deadline = min(arrival + self.body_timeout_s, deadline or float("inf"))
            body = await until(body_deadline, self._read_body(headers.get(b"content-length"), receive),
                               self._body_timed_out)
        except APIError as e:
            return await e.response()(scope, receive, send)
        if body is None:  # the client left before sending its body
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    def _check_key(authorization: bytes | None, keys: KeyRing) -> Caller:
        if not authorization:
            raise Unauthorized("You didn't provide an API key: send it as 'Authorization: Bearer <key>'",
                               code="missing_api_key")
        scheme, _, key = authorization.partition(b" ")
        caller = keys.caller(key.strip()) if scheme.lower() == b"bearer" else None
        if caller is None:
            raise Unauthorized("Incorrect API key provided", code="invalid_api_key")
        return caller

    def _body_timed_out(self) -> RequestTimeout:
        waited = min(self.body_timeout_s, self.request_timeout_s or self.body_timeout_s)
        return RequestTimeout(f"the request body did not arrive within {waited:g} s", code="body_timeout")

    async def _read_body(self, content_length: bytes | None, receive) -> bytes | None:
        if content_length is not None:
            try:
                declared = int(content_length)
            except ValueError:
                raise BadRequest("invalid Content-Length header", code="invalid_header") from None
            if declared > self.max_body_bytes:
                raise self._too_large(declared)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large(size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self, size: int) -> PayloadTooLarge:
        return PayloadTooLarge(f"the request body ({size} bytes or more) exceeds the limit of "
                               f"{self.max_body_bytes} bytes", code="request_too_large")
