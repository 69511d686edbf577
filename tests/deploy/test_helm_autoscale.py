"""The chart's `serve.autoscale`: each role's range comes from its worker groups' minReplicas and
maxReplicas, the SLO targets reach the Serve app as ServeConfig fields the pool scaler is built
from, KubeRay's autoscaler is turned on with it (it brings the pods the pool's node actors ask for);
off by default; enabled without targets, the chart refuses."""
from __future__ import annotations

import helm_python
import pytest

from raypd.cluster.autoscale.config import RoleRange
from raypd.cluster.serve.config import ServeConfig
from raypd.protocol.roles import Role

SLO = {"enabled": True, "ttft": 1.5, "tpot": 0.05}
GROUPS = {"prefill": {"replicas": 2, "minReplicas": 1, "maxReplicas": 4},
          "decode": {"replicas": 2, "maxReplicas": 6}}


def test_each_role_scales_within_its_groups_replicas_and_kuberay_brings_the_pods(render):
    rendered = render({"serve": {"autoscale": {**SLO, "windowSeconds": 20, "options": {"down_hold_s": 120}}},
                       "workerGroups": GROUPS})
    args = rendered.app_args
    assert args["autoscale"] == "prefill=1:4,decode=2:6"
    scaling = ServeConfig.from_args(dict(args)).autoscale_config()
    assert scaling is not None
    assert scaling.ranges == (RoleRange(Role.PREFILL, 1, 4), RoleRange(Role.DECODE, 2, 6))
    assert (scaling.ttft_target_s, scaling.tpot_target_s, scaling.window_s, scaling.down_hold_s) == (1.5, 0.05, 20, 120)
    assert rendered.cluster["enableInTreeAutoscaling"] is True
    assert rendered.group("decode")["maxReplicas"] == 6


def test_with_adaptive_the_pd_groups_are_one_flex_range(render):
    args = render({"serve": {"adaptive": True, "autoscale": SLO}, "workerGroups": GROUPS}).app_args
    assert args["autoscale"] == "flex=3:10"
    assert ServeConfig.from_args(dict(args)).autoscale_config().ranges == (RoleRange(Role.FLEX, 3, 10),)


def test_off_by_default_and_refused_without_its_targets(render):
    rendered = render()
    assert not any(k.startswith("autoscale") for k in rendered.app_args)
    assert rendered.cluster["enableInTreeAutoscaling"] is False
    with pytest.raises(Exception, match="serve.autoscale.ttft and serve.autoscale.tpot"):
        render({"serve": {"autoscale": {"enabled": True, "ttft": 2}}})
    with pytest.raises(helm_python.HelmValuesError, match="attainment"):
        render({"serve": {"autoscale": {**SLO, "attainment": 1.5}}})
