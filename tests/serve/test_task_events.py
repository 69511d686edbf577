"""untracked(): per-request and periodic actor calls are made with Ray's task events off."""
from __future__ import annotations

from raypd.metrics.task_events import untracked


class Method:
    def __init__(self):
        self.options_seen: dict = {}

    def options(self, **options):
        self.options_seen = options
        return self

    def remote(self, *args):
        return args


def test_an_actor_method_gets_task_events_off_and_a_stand_in_passes_through():
    method = Method()
    assert untracked(method) is method and method.options_seen == {"enable_task_events": False}

    class Bare:
        @staticmethod
        def remote(*args):
            return args
    assert untracked(Bare).remote(1, 2) == (1, 2)
