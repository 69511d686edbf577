"""The ingress's gate, as plain ASGI middleware in front of FastAPI: the API key (401) and the body
size limit (413), decided before any byte of the body is parsed.

A declared Content-Length over the limit is refused without reading; a chunked body is read up to
the limit and refused as soon as it passes it. The accepted body is buffered and replayed to the
app, whose later receive() calls (disconnect detection while streaming) reach the real channel.
"""
from __future__ import annotations

import hmac

from raypd.cluster.openai.api_errors import APIError, BadRequest, PayloadTooLarge, Unauthorized

OPEN_PATHS = frozenset({"/health"})  # probes must work without the key


class GuardMiddleware:
    def __init__(self, app, api_key: str | None, max_body_bytes: int):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        try:
            if self.api_key is not None and scope.get("path") not in OPEN_PATHS:
                self._check_key(headers.get(b"authorization"), self.api_key)
            if scope.get("method") not in ("POST", "PUT", "PATCH"):
                return await self.app(scope, receive, send)
            body = await self._read_body(headers.get(b"content-length"), receive)
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
    def _check_key(authorization: bytes | None, expected: bytes) -> None:
        if not authorization:
            raise Unauthorized("You didn't provide an API key: send it as 'Authorization: Bearer <key>'",
                               code="missing_api_key")
        scheme, _, key = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(key.strip(), expected):
            raise Unauthorized("Incorrect API key provided", code="invalid_api_key")

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
