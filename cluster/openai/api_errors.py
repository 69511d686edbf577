"""Errors of the HTTP surface, each with its status and its OpenAI-style body
`{"error": {"message", "type", "param", "code"}}`, and the one mapping from the typed exceptions of
the layers below (engine, driver, Conductor, pydantic) to them.

Everything a client can send ends in a 4xx: an exception that reaches `api_error()` untyped is a
bug of ours and answers 500 with a generic message (the detail goes to the log, not to the client).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi.responses import JSONResponse

log = logging.getLogger(__name__)


class APIError(Exception):
    status = 500
    type = "server_error"

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class BadRequest(APIError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(APIError):
    status = 401
    type = "invalid_request_error"


class NotFound(APIError):
    status = 404
    type = "invalid_request_error"


class MethodNotAllowed(APIError):
    status = 405
    type = "invalid_request_error"


class PayloadTooLarge(APIError):
    status = 413
    type = "invalid_request_error"


# Retry-After of every 429: the ingress's and the nodes' queues turn over within about a second
# (a few decode steps), and the Conductor's load view is refreshed twice a second.
RETRY_AFTER_S = 1


class RequestTimeout(APIError):
    """The client did not send its body within the body deadline (a slow or stalled upload)."""
    status = 408
    type = "timeout_error"


class RateLimited(APIError):
    """The cluster is full (a bounded queue at the ingress or a node) or its SLO admission said no:
    retrying later may succeed, so the answer always carries Retry-After."""
    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, retry_after_s: int = RETRY_AFTER_S):
        super().__init__(message, param, code, {"retry-after": str(retry_after_s), **(headers or {})})


class ServiceUnavailable(APIError):
    """No node can serve, or a node failed while serving: not the client's fault."""
    status = 503
    type = "service_unavailable_error"


class GatewayTimeout(APIError):
    """The request's total deadline (`--request-timeout`) passed before the cluster finished it; its
    work on the nodes was aborted. 504: the ingress is a gateway and its upstream, the cluster, did
    not answer in time (408 is kept for a client too slow to send its body)."""
    status = 504
    type = "timeout_error"


def api_error(exc: BaseException) -> APIError:
    """The APIError a typed exception from any layer answers with."""
    import ray.exceptions
    from pydantic import ValidationError

    from raypd.cluster.client.router import NoNodeError
    from raypd.conductor.errors import AdmissionRejected, NoCandidateError
    from raypd.engine.errors import InvalidRequestError
    from raypd.protocol.errors import OverloadedError

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return BadRequest(str(exc), exc.param)
    if isinstance(exc, ValidationError):
        return from_validation_errors(exc.errors(include_url=False))
    if isinstance(exc, AdmissionRejected):
        return RateLimited(f"the cluster cannot meet its latency target for this request now ({exc.reason} "
                           f"estimate {exc.estimate_s:.2f}s > {exc.slo_s:.2f}s); retry later",
                           code="slo_rejected")
    if isinstance(exc, OverloadedError):
        return RateLimited(f"the cluster is at capacity: {exc}; retry later", code="node_queue_full")
    if isinstance(exc, (NoNodeError, NoCandidateError)):
        return ServiceUnavailable(f"no node can serve this request: {exc}", code="no_node")
    if isinstance(exc, ray.exceptions.RayError):
        return ServiceUnavailable(f"a cluster component failed: {type(exc).__name__}", code="node_failure")
    log.error("unexpected error in the ingress", exc_info=exc)
    return APIError("internal error in the ingress", code="internal_error")


def from_validation_errors(errors: Sequence[Mapping[str, Any]]) -> BadRequest:
    """A 400 from pydantic validation errors, naming the first offending field."""
    if not errors:
        return BadRequest("invalid request body")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    kind = first.get("type", "")
    if kind == "json_invalid":
        return BadRequest(f"could not parse the JSON body: {first.get('msg', 'invalid JSON')}", code="invalid_json")
    param = _param(loc)
    if not param:
        return BadRequest("the request body must be a JSON object", None, "invalid_json")
    if kind == "extra_forbidden":
        return BadRequest(f"Unrecognized request argument supplied: {param}", param, "unknown_parameter")
    if kind == "missing":
        return BadRequest(f"{param}: a required field is missing", param, "missing_required_parameter")
    # A field with several accepted forms (a union) fails once per form: say what each wanted.
    same = [e for e in errors if tuple(e.get("loc", ()))[:1] == tuple(first.get("loc", ()))[:1]] or [first]
    reasons = list(dict.fromkeys(e.get("msg", "invalid value") for e in same))
    return BadRequest(f"{param}: {'; or '.join(reasons[:3])}", param, "invalid_value")


def _param(loc: list[str]) -> str:
    """('messages', '0', 'content', 'str') -> 'messages[0].content'; union member tags are dropped."""
    out = ""
    for part in loc:
        if part.isdigit():
            out += f"[{part}]"
        elif part not in _TYPE_TAGS and part[:1].islower() and not any(c in part for c in "[]()-"):
            out += ("." if out else "") + part
    return out


# Union members pydantic names in an error's location; no request field is called like them.
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}
