"""The chart's back-pressure values (`serve.admission`) reach the Serve app's args as ServeConfig
fields the app builder accepts; unset, they add nothing; out of range, the values schema refuses."""
from __future__ import annotations

import re

import helm_python
import pytest

from raypd.cluster.serve.config import ServeConfig

ADMISSION = {"serve": {"admission": {"ttftSlo": 2.5, "maxOngoingRequests": 96, "maxQueuedRequests": 32,
                                     "maxWaitingRequests": 8},
                       "extraArgs": {"engine_options": {"max_running_requests": 16}}}}


def test_admission_values_become_app_args(render):
    args = render(ADMISSION).app_args
    assert (args["ttft_slo_s"], args["max_ongoing_requests"], args["max_queued_requests"]) == (2.5, 96, 32)
    # The node bound is an engine option, merged with the user's own engine options.
    assert args["engine_options"] == {"max_waiting_requests": 8, "max_running_requests": 16}
    cfg = ServeConfig.from_args(dict(args))
    assert cfg.admission_limits() == (96, 32)
    assert cfg.cluster_spec().conductor_options == {"ttft_slo_s": 2.5}


def test_admission_off_by_default_adds_no_args(render):
    args = render().app_args
    assert not {"ttft_slo_s", "max_ongoing_requests", "max_queued_requests", "engine_options"} & set(args)


@pytest.mark.parametrize("admission,where", [
    ({"ttftSlo": 0}, "/serve/admission/ttftSlo"),
    ({"maxOngoingRequests": 0}, "/serve/admission/maxOngoingRequests"),
    ({"maxQueuedRequests": -1}, "/serve/admission/maxQueuedRequests"),
    ({"maxWaitingRequests": 2.5}, "/serve/admission/maxWaitingRequests"),
    ({"maxOngoing": 4}, "maxOngoing"),
], ids=["slo", "ongoing", "queued", "waiting", "typo"])
def test_admission_schema_rejects(render, admission, where):
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(where)):
        render({"serve": {"admission": admission}})
