"""The Helm chart (helm/raypd) through Helm's own engine: lint, render with default and non-default
values, the values schema, and the `fail` guards (which Helm's lint skips, so they are rendered)."""
from __future__ import annotations

import base64
import json
import re

import helm_python
import pytest
import yaml

from tests.deploy import crd_schema
from tests.deploy.chart_values import BIG, CPU, EXISTING_SECRET, HOSTPATH, MIXED, PVC, containers, ports
from tests.deploy.conftest import CHART

# --- lint -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("values", [None, BIG, MIXED], ids=["default", "big", "mixed"])
def test_chart_lints_clean(values):
    result = helm_python.lint(str(CHART), values, strict=True, kube_version="v1.30.0")
    assert result["total_charts_linted"] == 1
    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] >= 2] == []


def test_lint_applies_the_values_schema():
    result = helm_python.lint(str(CHART), {"serve": {"policy": "fastest"}}, strict=True)
    problems = [m["error"] for m in result["messages"] if m["severity"] == 3]
    assert any("/serve/policy" in p for p in problems), result


# --- default values -------------------------------------------------------------------------------

def test_default_render_kinds_and_names(render):
    r = render()
    assert sorted(o["kind"] for o in r.objects) == ["RayService", "Service"]
    assert r.rayservice["apiVersion"] == "ray.io/v1"
    assert r.rayservice["metadata"]["name"] == "raypd"
    assert r.one("Service")["metadata"]["name"] == "raypd-metrics"
    for obj in r.objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "raypd"


def test_default_head_ports_and_ray_start(render):
    head = render().head
    (c,) = head["template"]["spec"]["containers"]
    assert c["name"] == "ray-head"
    assert ports(c) == {"gcs": 6379, "dashboard": 8265, "client": 10001, "serve": 8000, "metrics": 8080}
    assert head["rayStartParams"] == {"dashboard-host": "0.0.0.0", "dashboard-port": "8265", "port": "6379",
                                      "metrics-export-port": "8080"}
    assert head["labels"] == {"raypd.io/role": "head"}
    # The head keeps KubeRay's probes: the operator deploys the app only once the head is Ready.
    assert "readinessProbe" not in c and "livenessProbe" not in c
    assert "nvidia.com/gpu" not in c["resources"]["limits"]


def test_default_worker_groups(render):
    r = render()
    assert sorted(g["groupName"] for g in r.cluster["workerGroupSpecs"]) == ["decode", "prefill"]
    for role in ("prefill", "decode"):
        g = r.group(role)
        assert (g["replicas"], g["minReplicas"], g["maxReplicas"]) == (1, 1, 1)
        assert g["labels"] == {"raypd.io/role": role, "raypd.io/tor": "tor-1"}
        assert g["resources"] == {f"{role}_gpu": "1"}
        assert g["rayStartParams"] == {"metrics-export-port": "8080"}
        spec = g["template"]["spec"]
        (c,) = spec["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert c["resources"]["requests"]["nvidia.com/gpu"] == 1
        assert ports(c) == {"serve": 8000, "metrics": 8080}
        assert c["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "serve"}
        assert "livenessProbe" not in c
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert "env" not in c     # no API key configured
        assert g["template"]["metadata"]["labels"]["raypd.io/component"] == role


def test_default_serve_config(render):
    r = render()
    cfg = r.serve_config
    (app,) = cfg["applications"]
    assert app["import_path"] == "raypd.cluster.serve_app:app_builder"
    assert app["route_prefix"] == "/"
    assert app["args"] == {"model": None, "prefill_nodes": 1, "decode_nodes": 1, "mixed_nodes": 0,
                           "gpus_per_node": 1, "place_by_role": True, "policy": "cost", "request_timeout_s": 600,
                           "transfer_options": {"nixl_backend": "UCX"}}
    # The app builder accepts them, and the role labels it places by are on every worker group.
    from raypd.cluster.serve.config import ServeConfig
    assert ServeConfig.from_args(dict(app["args"])).cluster_spec().place_by_role
    groups = r.rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert {g["labels"]["raypd.io/role"] for g in groups} == {"prefill", "decode"}
    assert cfg["http_options"] == {"host": "0.0.0.0", "port": 8000}
    svc = r.rayservice["spec"]["serveService"]
    assert svc["metadata"]["name"] == "raypd-serve-svc"
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [{"name": "serve", "port": 8000, "targetPort": 8000}]
    assert "upgradeStrategy" not in r.rayservice["spec"]


@pytest.mark.parametrize("given", [None, "cluster.serve_app:app_builder", "raypd.cluster.serve_app:app_builder"])
def test_serve_import_path_resolves_to_the_installed_builder(render, given):
    """The chart's path imports in this environment; the path from before the one root package
    (cluster.serve_app:app_builder) is rewritten to it, so existing values keep working."""
    import importlib

    values = {} if given is None else {"serve": {"importPath": given}}
    (app,) = render(values).serve_config["applications"]
    assert app["import_path"] == "raypd.cluster.serve_app:app_builder"
    module, _, attr = app["import_path"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))


def test_default_notes_warn_about_the_open_endpoint(render):
    notes = render().notes
    assert "http://raypd-serve-svc.llm.svc:8000/v1" in notes
    assert "port-forward svc/raypd-head-svc 8265:8265" in notes
    assert "WARNING: no API key" in notes


# --- non-default values ---------------------------------------------------------------------------

def test_big_groups_replicas_gpus_and_placement(render):
    r = render(BIG)
    assert r.rayservice["metadata"]["name"] == "llm-prod"
    assert sorted(g["groupName"] for g in r.cluster["workerGroupSpecs"]) == ["decode", "prefill", "prefill-r2"]
    p = r.group("prefill")
    assert (p["replicas"], p["minReplicas"], p["maxReplicas"]) == (3, 2, 4)
    assert p["labels"] == {"raypd.io/role": "prefill", "raypd.io/tor": "tor-1", "raypd.io/spine": "spine-0"}
    assert p["template"]["spec"]["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    r2 = r.group("prefill-r2")
    assert r2["labels"] == {"raypd.io/role": "prefill", "raypd.io/tor": "tor-2"}
    assert r2["template"]["spec"]["nodeSelector"] == {"example.com/rack": "r2"}
    assert (r.group("decode")["replicas"], r.group("decode")["maxReplicas"]) == (2, 2)
    for name in ("prefill", "prefill-r2", "decode"):
        g = r.group(name)
        (c,) = g["template"]["spec"]["containers"]
        assert c["image"] == "registry.example.com/raypd:1.2.3"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 == c["resources"]["requests"]["nvidia.com/gpu"]
        assert g["resources"] == {f"{g['labels']['raypd.io/role']}_gpu": "1"}
        assert c["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "serve"}
        assert c["livenessProbe"]["initialDelaySeconds"] == 900


def test_big_serve_args_count_nodes_per_role(render):
    args = render(BIG).app_args
    assert args["prefill_nodes"] == 4          # 3 in `prefill` + 1 in `prefill-r2`
    assert args["decode_nodes"] == 2
    assert args["gpus_per_node"] == 1
    assert args["model"] == "/models/qwen"
    assert args["policy"] == "cache_aware"     # the chart's own args win over extraArgs
    assert (args["served_model_name"], args["ingress_replicas"]) == ("qwen", 2)   # other extraArgs pass through
    assert args["topology"] == "/etc/raypd/topology.yaml"


def test_big_api_key_secret_reaches_every_ray_container(render):
    r = render(BIG)
    secret = r.one("Secret")
    assert secret["metadata"]["name"] == "llm-prod-api-key"
    assert base64.b64decode(secret["data"]["api-key"]).decode() == "sk-test-123"
    for c in containers(r):
        env = {e["name"]: e for e in c["env"]}
        assert env["RAYPD_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "llm-prod-api-key", "key": "api-key"}
    assert "sk-test-123" not in json.dumps(r.rayservice)
    assert "Secret llm-prod-api-key" in r.notes and "WARNING" not in r.notes


def test_existing_secret_is_referenced_not_created(render):
    r = render(EXISTING_SECRET)
    assert r.of_kind("Secret") == []
    for c in containers(r):
        (env,) = c["env"]
        assert env == {"name": "RAYPD_API_KEY", "valueFrom": {"secretKeyRef": {"name": "my-key", "key": "token"}}}


def test_an_api_keys_file_secret_is_mounted_in_every_ray_container_and_named_to_the_app(render):
    r = render({**EXISTING_SECRET, "apiKeysFile": {"existingSecret": "tenant-keys", "secretKey": "keys.yaml"}})
    assert r.app_args["api_keys_file"] == "/etc/raypd-keys/keys.yaml"
    specs = [r.head["template"]["spec"]] + [g["template"]["spec"] for g in r.cluster["workerGroupSpecs"]]
    for spec in specs:
        (vol,) = [v for v in spec["volumes"] if v["name"] == "api-keys"]
        assert vol["secret"] == {"secretName": "tenant-keys", "items": [{"key": "keys.yaml", "path": "keys.yaml"}]}
        mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
        assert mounts["api-keys"] == {"name": "api-keys", "mountPath": "/etc/raypd-keys", "readOnly": True}
    assert r.of_kind("Secret") == []  # referenced, never created
    assert "API keys file: Secret tenant-keys" in r.notes
    plain = render(EXISTING_SECRET)
    assert "api_keys_file" not in plain.app_args
    assert all(v["name"] != "api-keys" for v in plain.head["template"]["spec"].get("volumes", []))


def test_data_plane_secret_reaches_every_ray_container_by_reference(render):
    r = render({**EXISTING_SECRET, "dataPlaneSecret": {"existingSecret": "dp", "secretKey": "k"}})
    for c in containers(r):
        env = {e["name"]: e for e in c["env"]}
        assert env["RAYPD_DATA_PLANE_SECRET"] == {"name": "RAYPD_DATA_PLANE_SECRET",
                                                  "valueFrom": {"secretKeyRef": {"name": "dp", "key": "k"}}}
    assert r.of_kind("Secret") == []  # referenced, never created: its bytes are not in the chart
    r = render(EXISTING_SECRET)
    assert all("RAYPD_DATA_PLANE_SECRET" not in json.dumps(c.get("env", [])) for c in containers(r))


def test_big_model_claim_and_download_init_container(render):
    r = render(BIG)
    for spec in [r.head["template"]["spec"]] + [g["template"]["spec"] for g in r.cluster["workerGroupSpecs"]]:
        (vol,) = [v for v in spec["volumes"] if v["name"] == "model"]
        assert vol["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": False}
        (init,) = spec["initContainers"]
        assert init["command"] == ["sh", "-c", "test -d /models/qwen || echo fetch"]
        assert init["volumeMounts"] == [{"name": "model", "mountPath": "/models"}]   # writable
        mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
        assert mounts["model"] == {"name": "model", "mountPath": "/models", "readOnly": True}
        assert mounts["topology"]["mountPath"] == "/etc/raypd"
    assert r.of_kind("PersistentVolumeClaim") == []     # an existing claim is not created


def test_big_services_upgrade_strategy_topology_and_podmonitor(render):
    r = render(BIG)
    svc = r.rayservice["spec"]["serveService"]
    assert svc["metadata"]["name"] == "llm-prod-serve-svc"
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["metadata"]["annotations"] == {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}
    assert r.rayservice["spec"]["upgradeStrategy"] == {"type": "None"}
    cm = r.one("ConfigMap")
    assert yaml.safe_load(cm["data"]["topology.yaml"]) == {"switches": [{"name": "tor-1", "kind": "tor"}]}
    pm = r.one("PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "raypd",
                                                     "app.kubernetes.io/instance": "raypd"}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_mixed_only(render):
    r = render(MIXED)
    assert [g["groupName"] for g in r.cluster["workerGroupSpecs"]] == ["mixed"]
    g = r.group("mixed")
    assert g["labels"]["raypd.io/role"] == "mixed" and g["resources"] == {"mixed_gpu": "1"}
    assert g["replicas"] == 2
    args = r.app_args
    assert (args["prefill_nodes"], args["decode_nodes"], args["mixed_nodes"]) == (0, 0, 2)


def test_cpu_only_requests_no_gpu(render):
    r = render(CPU)
    for c in containers(r):
        assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
        assert "nvidia.com/gpu" not in c["resources"].get("requests", {})
    for g in r.cluster["workerGroupSpecs"]:
        assert "resources" not in g
    assert r.app_args["gpus_per_node"] == 0


def test_hostpath_model(render):
    r = render(HOSTPATH)
    (vol,) = r.head["template"]["spec"]["volumes"]
    assert vol == {"name": "model", "hostPath": {"path": "/mnt/models", "type": "Directory"}}
    assert r.app_args["model"] == "/models/m"
    assert "initContainers" not in r.head["template"]["spec"]


def test_chart_made_pvc(render):
    r = render(PVC)
    pvc = r.one("PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == "raypd-model"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "efs",
                           "resources": {"requests": {"storage": "200Gi"}}}
    # Validate the claim's spec with the PVC schema embedded in the CRD (ephemeral volume template).
    path = ("properties", "spec", "properties", "rayClusterConfig", "properties", "headGroupSpec",
            "properties", "template", "properties", "spec", "properties", "volumes", "items", "properties",
            "ephemeral", "properties", "volumeClaimTemplate", "properties", "spec")
    assert crd_schema.errors("RayService", pvc["spec"], path) == []
    (vol,) = r.group("decode")["template"]["spec"]["volumes"]
    assert vol["persistentVolumeClaim"] == {"claimName": "raypd-model", "readOnly": True}


# --- guards: Helm's lint ignores `fail`/`required`, so render --------------------------------------

GUARDS = [
    ({"fullnameOverride": "a" * 48}, "at most 47"),
    ({"fullnameOverride": "9lives"}, "DNS-1035"),
    ({"workerGroups": {"decode": {"enabled": False}}}, "at least one prefill and one decode"),
    ({"workerGroups": {"decode": {"replicas": 0}}}, "at least one prefill and one decode"),
    ({"workerGroups": {"prefill": {"enabled": False}, "decode": {"enabled": False}}}, "or a mixed replica"),
    ({"workerGroups": {"decode": {"enabled": False}, "mixed": {"enabled": True}}}, "come together"),
    ({"workerGroups": {"mixed": {"enabled": True}}}, "not both"),
    ({"workerGroups": {"decode": {"minReplicas": 3}}}, "minReplicas <= replicas <= maxReplicas"),
    ({"workerGroups": {"decode": {"maxReplicas": 0}}}, "minReplicas <= replicas <= maxReplicas"),
    ({"workerGroups": {"Decode_GPU": {"enabled": True, "role": "decode"}}}, "worker group name"),
    ({"apiKey": {"value": "k", "existingSecret": "s"}}, "not both"),
    ({"model": {"volume": {"type": "hostPath"}}}, "hostPath.path"),
    ({"model": {"volume": {"type": "existingClaim"}}}, "existingClaim (the PVC's name)"),
    ({"model": {"download": {"enabled": True, "command": ["true"]}}}, "needs a model volume"),
    ({"model": {"volume": {"type": "emptyDir"}, "download": {"enabled": True}}}, "needs model.download.command"),
    ({"model": {"path": "/data/m", "volume": {"type": "emptyDir"}}}, "not under the model volume"),
    ({"ports": {"metrics": 10002}}, "worker port range"),
    ({"head": {"rayStartParams": {"num-cpus": "0"}}}, "rayStartParams.num-cpus is not allowed"),
    ({"workerGroups": {"decode": {"rayStartParams": {"labels": "a=b"}}}}, "rayStartParams.labels is not allowed"),
]


@pytest.mark.parametrize("values,message", GUARDS, ids=[m for _, m in GUARDS])
def test_guard_fails_render(render, values, message):
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(message)):
        render(values)


def test_name_limit_is_exactly_47(render):
    assert render({"fullnameOverride": "a" * 47}).rayservice["metadata"]["name"] == "a" * 47
    assert render(name="r" * 41).rayservice["metadata"]["name"] == "r" * 41 + "-raypd"   # 47
    with pytest.raises(helm_python.HelmRenderError, match="at most 47"):
        render(name="r" * 42)


@pytest.mark.parametrize("values,where", [
    ({"serve": {"policy": "fastest"}}, "/serve/policy"),
    ({"workerGroups": {"decode": {"replicas": -1}}}, "/workerGroups/decode/replicas"),
    ({"workerGroups": {"decode": {"role": "both"}}}, "/workerGroups/decode/role"),
    ({"workerGroups": {"prefill": {"rayLabels": {"raypd.io/tor": 3}}}}, "/workerGroups/prefill/rayLabels"),
    ({"workerGroup": {}}, "workerGroup"),
    ({"gpusPerNode": 1.5}, "/gpusPerNode"),
], ids=["policy", "replicas", "role", "label-type", "typo", "gpus"])
def test_values_schema_rejects(render, values, where):
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(where)):
        render(values)


def test_request_timeout_reaches_the_app_and_the_schema_bounds_it(render):
    from raypd.cluster.serve.config import ServeConfig

    args = render({"serve": {"requestTimeoutSeconds": 45.5}}).app_args
    assert args["request_timeout_s"] == 45.5
    assert ServeConfig.from_args(dict(args)).request_timeout_s == 45.5
    for bad in (0, -1, "10"):
        with pytest.raises(helm_python.HelmValuesError, match=re.escape("/serve/requestTimeoutSeconds")):
            render({"serve": {"requestTimeoutSeconds": bad}})


def test_policy_enum_matches_the_conductor_registry():
    from raypd.conductor.policies import POLICIES

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["serve"]["properties"]["policy"]["enum"]) == set(POLICIES)
