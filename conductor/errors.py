"""Typed errors of the Conductor. Callers match on the class, never on the message."""
from __future__ import annotations


class ConductorError(Exception):
    """Base of every error the Conductor raises on purpose."""


class UnknownNodeError(ConductorError, KeyError):
    def __init__(self, node: str):
        super().__init__(node)
        self.node = node

    def __str__(self) -> str:
        return f"unknown node {self.node!r}"

    def __reduce__(self):   # errors cross Ray actor boundaries: rebuild from the same arguments
        return (type(self), (self.node,))


class InvalidRoleError(ConductorError, ValueError):
    pass


class UnknownPolicyError(ConductorError, KeyError):
    pass


class NoCandidateError(ConductorError):
    """No live node can take this request (no prefill node, or no decode node with room)."""


class AdmissionRejected(ConductorError):
    """The best estimate breaks an SLO: reject now (the HTTP layer maps this to 429) rather than
    queue a request that is known to miss. Carries the decision that would have been taken."""

    def __init__(self, request_id: str, reason: str, estimate_s: float, slo_s: float, decision=None):
        super().__init__(f"request {request_id} rejected: {reason} estimate {estimate_s:.3f}s > SLO {slo_s:.3f}s")
        self.request_id = request_id
        self.reason = reason  # "ttft" or "tbt"
        self.estimate_s = estimate_s
        self.slo_s = slo_s
        self.decision = decision

    def __reduce__(self):
        return (type(self), (self.request_id, self.reason, self.estimate_s, self.slo_s, self.decision))


class HashSchemeMismatch(ConductorError):
    """A node's BlockStored hashes differ from what engine.block_hash computes for its tokens: the
    node and the Conductor name blocks differently, so every match against that node would be zero.
    Raised loudly instead of silently zeroing the hit rate."""

    def __init__(self, node: str, expected: int, got: int):
        super().__init__(f"node {node!r} names a block {got:#x}, engine.block_hash gives {expected:#x}")
        self.node, self.expected, self.got = node, expected, got

    def __reduce__(self):
        return (type(self), (self.node, self.expected, self.got))


class TopologyError(ConductorError, ValueError):
    pass


class DutyOrderRefused(ConductorError, ValueError):
    """A duty order that cannot be carried out: the node is not flex, or it would leave no node to
    decode (or, without local prefill, none to prefill)."""


class RetireRefused(ConductorError, ValueError):
    """The node pool asked to drain a node whose leaving would leave no node to decode (or, without
    local prefill, none to prefill)."""


class MigrationError(ConductorError):
    pass
