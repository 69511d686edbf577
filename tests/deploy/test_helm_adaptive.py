"""The chart's `serve.adaptive`, `serve.localPrefillBudget` and `serve.tpotTarget` reach the Serve app as ServeConfig
fields, and from there the Conductor's split-or-local choice and the decode nodes' per-step prompt
budget; off by default; the schema refuses a budget below one token."""
from __future__ import annotations

import helm_python
import pytest

from raypd.cluster.serve.config import ServeConfig, ServeConfigError


def test_adaptive_values_become_app_args_and_the_cluster_spec(render):
    args = render({"serve": {"adaptive": True, "localPrefillBudget": 48}}).app_args
    assert (args["adaptive"], args["local_prefill_budget"]) == (True, 48)
    spec = ServeConfig.from_args(dict(args)).cluster_spec()
    assert spec.local_prefill_budget == 48


def test_a_tpot_target_reaches_the_cluster_spec(render):
    args = render({"serve": {"adaptive": True, "tpotTarget": 0.15}}).app_args
    assert args["tpot_target_s"] == 0.15
    assert ServeConfig.from_args(dict(args)).cluster_spec().tpot_target_s == 0.15
    with pytest.raises(helm_python.HelmValuesError, match="tpotTarget"):
        render({"serve": {"adaptive": True, "tpotTarget": 0}})
    # Without adaptive there is no duty planner to steer: the app refuses it, as `raypd serve` does.
    alone = render({"serve": {"tpotTarget": 0.15}}).app_args
    with pytest.raises(ServeConfigError, match="needs --adaptive"):
        ServeConfig.from_args(dict(alone))


def test_adaptive_off_by_default(render):
    args = render().app_args
    assert "adaptive" not in args and "local_prefill_budget" not in args and "tpot_target_s" not in args
    assert ServeConfig.from_args(dict(args)).cluster_spec().local_prefill_budget is None


def test_schema_rejects_a_budget_below_one_token(render):
    with pytest.raises(helm_python.HelmValuesError, match="localPrefillBudget"):
        render({"serve": {"adaptive": True, "localPrefillBudget": 0}})
