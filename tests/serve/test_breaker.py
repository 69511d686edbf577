"""CircuitBreaker's states on an injected clock."""
from __future__ import annotations

from raypd.cluster.client.breaker import BreakerState, CircuitBreaker


def make():
    now = [0.0]
    return CircuitBreaker(failures=3, window_s=10, cooldown_s=5, clock=lambda: now[0]), now


def test_opens_after_failures_within_the_window_only():
    b, now = make()
    b.failure("n")
    now[0] = 11  # the first failure left the window
    b.failure("n")
    b.failure("n")
    assert b.state("n") is BreakerState.CLOSED and b.excluded() == frozenset()
    b.failure("n")
    assert b.state("n") is BreakerState.OPEN and b.excluded() == {"n"}


def test_half_open_takes_traffic_and_the_first_outcome_decides():
    b, now = make()
    for _ in range(3):
        b.failure("n")
    now[0] = 4.9
    assert b.excluded() == {"n"}
    now[0] = 5
    assert b.excluded() == frozenset() and b.state("n") is BreakerState.HALF_OPEN
    b.success("n")
    assert b.state("n") is BreakerState.CLOSED
    for _ in range(3):
        b.failure("n")
    now[0] = 10
    assert b.state("n") is BreakerState.HALF_OPEN
    b.failure("n")                           # one failure while half open: open again at once
    assert b.state("n") is BreakerState.OPEN and b.excluded() == {"n"}
    now[0] = 15
    assert b.excluded() == frozenset()


def test_a_restarted_node_starts_closed():
    b, _ = make()
    for _ in range(3):
        b.failure("n")
    b.forget("n")
    assert b.state("n") is BreakerState.CLOSED and b.excluded() == frozenset()


def test_nodes_are_independent():
    b, _ = make()
    for _ in range(3):
        b.failure("a")
    b.failure("b")
    assert b.excluded() == {"a"}
