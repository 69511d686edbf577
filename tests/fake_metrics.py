"""A stand-in for ray.util.metrics that keeps what is recorded, for the metrics modules' unit tests.

Same constructor shapes as Ray's (Counter/Gauge(name, description, tag_keys), Histogram(name,
description, boundaries, tag_keys)), and as strict as Ray about tags: a recorded value must carry
exactly the declared tag keys.
"""
from __future__ import annotations

from collections import defaultdict


class _Metric:
    kind = "metric"

    def __init__(self, name: str, description: str = "", tag_keys: tuple = ()):
        assert isinstance(tag_keys, tuple), "Ray wants tag_keys as a tuple"
        self.name = name
        self.tag_keys = tag_keys
        self.values: dict[tuple, float] = defaultdict(float)  # sorted tag items -> value
        self.observations: dict[tuple, list[float]] = defaultdict(list)

    def _key(self, tags: dict | None) -> tuple:
        tags = tags or {}
        assert set(tags) == set(self.tag_keys), f"{self.name}: tags {sorted(tags)} != declared {self.tag_keys}"
        return tuple(sorted(tags.items()))

    def value(self, **tags: str) -> float:
        """Sum over the recorded series whose tags include `tags`."""
        return sum(v for k, v in self.values.items() if set(tags.items()) <= set(k))

    def observed(self, **tags: str) -> list[float]:
        return [x for k, xs in self.observations.items() if set(tags.items()) <= set(k) for x in xs]


class Counter(_Metric):
    kind = "counter"

    def inc(self, value: float = 1.0, tags: dict | None = None) -> None:
        assert value > 0, f"{self.name}: Ray counters only grow"
        self.values[self._key(tags)] += value


class Gauge(_Metric):
    kind = "gauge"

    def set(self, value: float, tags: dict | None = None) -> None:
        self.values[self._key(tags)] = value


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, description: str = "", boundaries: list | None = None, tag_keys: tuple = ()):
        super().__init__(name, description, tag_keys)
        assert boundaries and boundaries == sorted(boundaries) and boundaries[0] > 0, name
        self.boundaries = boundaries

    def observe(self, value: float, tags: dict | None = None) -> None:
        self.observations[self._key(tags)].append(value)


class FakeMetricsAPI:
    """Pass as `api=`: every metric made through it is kept in `made`, by name."""

    def __init__(self):
        self.made: dict[str, _Metric] = {}
        api = self

        def factory(cls):
            def make(*args, **kwargs):
                m = cls(*args, **kwargs)
                assert m.name not in api.made, f"{m.name} declared twice"
                api.made[m.name] = m
                return m
            return make

        self.Counter = factory(Counter)
        self.Gauge = factory(Gauge)
        self.Histogram = factory(Histogram)

    def __getitem__(self, name: str) -> _Metric:
        return self.made[name]
