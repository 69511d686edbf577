"""The metrics API every raypd metrics class records through: Ray's `ray.util.metrics` when this
process is part of a Ray cluster (so the series reach the Ray dashboard and Ray's Prometheus
endpoint), else a no-op one; tests inject a fake with the same constructors (tests/fake_metrics.py).

Imports no torch and no Ray at import time: Ray is looked up only once it is already initialized,
so a metrics class costs nothing in unit tests, the simulator or a bare FastAPI app.
"""
from __future__ import annotations

import sys
from typing import Protocol

Tags = dict[str, str]
TagKeys = tuple[str, ...]


# The shapes below are ray.util.metrics' own, so that module is a MetricsAPI as it is.
class Counter(Protocol):
    def inc(self, value: float = 1.0, tags: Tags = ...) -> None: ...


class Gauge(Protocol):
    def set(self, value: float, tags: Tags = ...) -> None: ...


class Histogram(Protocol):
    def observe(self, value: float, tags: Tags = ...) -> None: ...


class MetricsAPI(Protocol):
    """ray.util.metrics, or anything with the same three constructors (the no-op, a test's fake)."""

    def Counter(self, name: str, description: str = "", tag_keys: TagKeys | None = None) -> Counter: ...

    def Gauge(self, name: str, description: str = "", tag_keys: TagKeys | None = None) -> Gauge: ...

    def Histogram(self, name: str, description: str = "", boundaries: list[float] = ...,
                  tag_keys: TagKeys | None = None) -> Histogram: ...


class _NoopMetric:
    def inc(self, value: float = 1.0, tags: Tags | None = None) -> None:
        pass

    def set(self, value: float, tags: Tags | None = None) -> None:
        pass

    def observe(self, value: float, tags: Tags | None = None) -> None:
        pass


class _NoopAPI:
    def Counter(self, name: str, description: str = "", tag_keys: TagKeys | None = None) -> Counter:
        return _NoopMetric()

    def Gauge(self, name: str, description: str = "", tag_keys: TagKeys | None = None) -> Gauge:
        return _NoopMetric()

    def Histogram(self, name: str, description: str = "", boundaries: list[float] | None = None,
                  tag_keys: TagKeys | None = None) -> Histogram:
        return _NoopMetric()


NOOP: MetricsAPI = _NoopAPI()


def metrics_api(api: MetricsAPI | None = None) -> MetricsAPI:
    """`api` when given (a test's fake, or ray.util.metrics itself); else Ray's when this process
    is part of a Ray cluster; else NOOP, which records nothing."""
    if api is not None:
        return api
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return NOOP
    from ray.util import metrics

    return metrics
