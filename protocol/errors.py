"""InvalidRequestError: a request that can never be served as given, wherever it is checked.

The ingress, the sampling parameters and the engine all raise this one type (the engine re-exports
it), so the HTTP edge maps it to a 400 naming `param` whichever layer found the problem.
"""
from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request that can never be served as given. `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param
