"""`raypd serve --adaptive --local-prefill-budget N` reaches the cluster spec, which gives the
Conductor its split-or-local choice and the decode nodes their per-step prompt budget; settings
that cannot work fail before anything starts."""
from __future__ import annotations

import pytest

from raypd.cluster.cli.main import build_parser
from raypd.cluster.cli.serve import config_from_args
from raypd.cluster.launch.local_cluster import ClusterSpec, conductor_config
from raypd.cluster.serve.config import ServeConfigError
from raypd.conductor.config import TPOT_TARGET_SHARE


def serve_config(*argv: str):
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_adaptive_sets_the_local_prefill_budget_of_the_cluster():
    assert serve_config().cluster_spec().local_prefill_budget is None
    assert serve_config("--adaptive").cluster_spec().local_prefill_budget == 32
    assert serve_config("--adaptive", "--local-prefill-budget", "16").cluster_spec().local_prefill_budget == 16


@pytest.mark.parametrize("argv, message", [
    (["--adaptive", "--mixed-nodes", "2"], "needs both"),
    (["--adaptive", "--local-prefill-budget", "0"], "--local-prefill-budget"),
    (["--tpot-target", "0.1"], "needs --adaptive"),
    (["--adaptive", "--tpot-target", "0"], "--tpot-target must be > 0"),
])
def test_adaptive_settings_that_cannot_work_fail_at_once(argv, message):
    with pytest.raises(ServeConfigError, match=message):
        serve_config(*argv)


def test_cluster_spec_wants_a_conductor_and_decode_nodes_for_local_prefill():
    with pytest.raises(ValueError, match="Conductor policy"):
        ClusterSpec(prefill_nodes=1, decode_nodes=1, local_prefill_budget=32)
    with pytest.raises(ValueError, match=">= 1"):
        ClusterSpec(prefill_nodes=1, decode_nodes=1, policy="cost", local_prefill_budget=0)
    assert ClusterSpec(prefill_nodes=1, decode_nodes=1, policy="cost", local_prefill_budget=8).local_prefill_budget == 8


def test_a_tpot_target_steers_the_duty_planner_by_decode_step_time():
    """`--tpot-target S`: decode steps past 0.8 S call for another decode node; without it only
    decode KV memory does, and a plain PD cluster has no planner to steer."""
    spec = serve_config("--adaptive", "--tpot-target", "0.1").cluster_spec()
    assert spec.tpot_target_s == 0.1
    duties = conductor_config(spec, "cost").duties
    assert duties.decode_busy_step_s == TPOT_TARGET_SHARE * 0.1 and duties.min_prefill_nodes == 0
    assert conductor_config(serve_config("--adaptive").cluster_spec(), "cost").duties.decode_busy_step_s is None
    with pytest.raises(ValueError, match="flex nodes"):
        ClusterSpec(prefill_nodes=1, decode_nodes=1, policy="cost", tpot_target_s=0.1)
    # What an operator passes as conductor_options still wins over what the flags derive.
    own = ClusterSpec(prefill_nodes=1, decode_nodes=1, policy="cost", flex=True, tpot_target_s=0.1,
                      local_prefill_budget=32, conductor_options={"tbt_slo_s": 0.5})
    assert conductor_config(own, "cost").tbt_slo_s == 0.5
