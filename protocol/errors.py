"""The errors every layer shares, each mapped to one HTTP status at the edge.

InvalidRequestError: a request that can never be served as given, wherever it is checked. The
ingress, the sampling parameters and the engine all raise this one type (the engine re-exports it),
so the HTTP edge maps it to a 400 naming `param` whichever layer found the problem.

OverloadedError: a request refused for want of capacity (a node's waiting queue was full): it may
succeed later, so the HTTP edge answers 429 with Retry-After.
"""
from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request that can never be served as given. `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class OverloadedError(RuntimeError):
    """Refused for want of capacity, not for a fault: nothing of the request is held; retry later.
    `node` names the node that refused ("" when it was not a node)."""

    def __init__(self, message: str, node: str = ""):
        super().__init__(message)
        self.node = node
