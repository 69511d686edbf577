"""The rendered chart against KubeRay: the CRD schemas pinned in tests/deploy/kuberay/ (strict), the rules the
operator enforces beyond the schema (ray-operator/controllers/ray/utils/validation.go), and the
contract with the Serve app the RayService starts."""
from __future__ import annotations

import re
import warnings

import pytest
from ray._private import label_utils

from tests.deploy import crd_schema
from tests.deploy.chart_values import SCENARIOS, ports


@pytest.mark.parametrize("values", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_rayservice_matches_the_crd_schemas(render, values):
    r = render(values)
    assert crd_schema.errors("RayService", r.rayservice) == []
    # The embedded cluster spec is a RayClusterSpec: check it against the RayCluster CRD too.
    as_cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "x"},
                  "spec": r.cluster}
    assert crd_schema.errors("RayCluster", as_cluster) == []
    # The metrics Service (a core/v1 Service) against the Service schema the CRD embeds.
    for svc in r.of_kind("Service"):
        assert crd_schema.errors("RayService", svc, ("properties", "spec", "properties", "serveService")) == []


def test_the_crd_check_catches_mistakes(render):
    """The strict schema catches what the API server would silently drop or reject."""
    rs = render().rayservice
    group = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    group["replica"] = group.pop("replicas")
    group["minReplicas"] = "1"
    rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "6379"
    del rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][1]["groupName"]
    found = "\n".join(crd_schema.errors("RayService", rs))
    assert "'replica' was unexpected" in found
    assert "'1' is not of type 'integer'" in found
    assert "'6379' is not of type 'integer'" in found
    assert "'groupName' is a required property" in found


K8S_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_group_rules(where: str, group: dict) -> None:
    """KubeRay's validation.go: resources in one place, labels only top-level and well formed."""
    params = group.get("rayStartParams", {})
    if group.get("resources"):
        assert not {"num-cpus", "num-gpus", "memory", "resources"} & set(params), where
    assert "labels" not in params, where
    labels = group.get("labels", {})
    label_utils.validate_node_labels(labels)           # no ray.io/ prefix
    for key, value in labels.items():
        assert label_utils.validate_label_key(key) is None, (where, key)
        label_utils.validate_label_value(value)
        assert K8S_NAME.match(value) and len(value) <= 63, (where, value)
    assert int(params["metrics-export-port"]) < 10002, where
    containers = group["template"]["spec"]["containers"]
    assert containers, where
    volumes = {v["name"] for v in group["template"]["spec"].get("volumes", [])}
    for c in containers + group["template"]["spec"].get("initContainers", []):
        named = [p["name"] for p in c.get("ports", [])]
        assert len(named) == len(set(named)), (where, named)
        assert all(DNS_LABEL.match(n) and len(n) <= 15 for n in named), (where, named)
        for probe in ("readinessProbe", "livenessProbe"):
            if probe in c:
                assert c[probe]["httpGet"]["port"] in named, (where, probe)
        assert {m["name"] for m in c.get("volumeMounts", [])} <= volumes, where
    assert ports(containers[0])["metrics"] == int(params["metrics-export-port"]), where


@pytest.mark.parametrize("values", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_rayservice_follows_the_operators_rules(render, values):
    r = render(values)
    name = r.rayservice["metadata"]["name"]
    assert len(name) <= 47 and re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", name)
    assert "headService" not in r.head       # a RayService must not name the head Service
    check_group_rules("head", r.head)
    head_ports = ports(r.head["template"]["spec"]["containers"][0])
    assert head_ports["serve"] == r.serve_config["http_options"]["port"]
    assert str(head_ports["dashboard"]) == r.head["rayStartParams"]["dashboard-port"]
    for g in r.cluster["workerGroupSpecs"]:
        assert DNS_LABEL.match(g["groupName"])
        assert 0 <= g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
        check_group_rules(g["groupName"], g)
        assert g["labels"]["raypd.io/role"] in ("prefill", "decode", "mixed")
    with warnings.catch_warnings():      # ray.serve's pydantic models warn on import
        warnings.simplefilter("ignore")
        from ray.serve.schema import ServeDeploySchema
    ServeDeploySchema.model_validate(r.serve_config)
    # Node counts in the app args are what the groups start.
    for role in ("prefill", "decode", "mixed"):
        total = sum(g["replicas"] for g in r.cluster["workerGroupSpecs"] if g["labels"]["raypd.io/role"] == role)
        assert r.app_args[f"{role}_nodes"] == total


@pytest.mark.parametrize("values", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_app_args_are_what_the_app_builder_accepts(render, values, tmp_path):
    """The contract with cluster.serve_app:app_builder: its ServeConfig takes the rendered args."""
    from raypd.cluster.serve.config import ServeConfig

    args = dict(render(values).app_args)
    if "topology" in args:                   # the ConfigMap's file exists in the pods, not here
        args["topology"] = str(tmp_path / "topology.yaml")
        (tmp_path / "topology.yaml").write_text("switches: []\n")
    if "api_keys_file" in args:              # likewise the Secret's file
        args["api_keys_file"] = str(tmp_path / "keys.yaml")
        (tmp_path / "keys.yaml").write_text("keys:\n  - {key: sk-a, tenant: a}\n")
    config = ServeConfig.from_args(args)
    assert config.api_key is None            # the key travels as $RAYPD_API_KEY, never in the CR
    assert (config.prefill_nodes, config.decode_nodes, config.mixed_nodes) == (
        args["prefill_nodes"], args["decode_nodes"], args["mixed_nodes"])
