"""cluster/cluster.yaml for `ray up`, checked offline with the installed Ray's cluster launcher.

`ray up` runs prepare_config (merge the provider's defaults.yaml, merge setup commands, check
docker, fill per-type min/max workers), then the provider's fillout (AWS: boto3 + credentials to
look up instance types), then validate_config (ray-schema.json plus cross-field checks), then the
provider's bootstrap (IAM, subnets, key pairs). The AWS steps need boto3, credentials and the
network, so this test runs prepare_config + validate_config, the same calls in the same order,
without them. Both are private Ray APIs: pinned to the Ray in the venv (2.60).
"""
from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess

import jsonschema
import pytest
import yaml
from ray._private import label_utils, ray_constants
from ray._private.resource_and_label_spec import ResourceAndLabelSpec
from ray.autoscaler._private.command_runner import _with_environment_variables
from ray.autoscaler._private.util import prepare_config, validate_config

from raypd.conductor.topology import SPINE_LABEL, TOR_LABEL
from tests.deploy.conftest import CLUSTER_YAML

RAY_MIN_WORKER_PORT = 10002          # `ray start --min-worker-port` default
SERVE_FLAGS = {"--model", "--prefill-nodes", "--decode-nodes", "--mixed-nodes", "--gpus-per-node", "--policy",
               "--topology", "--host", "--port", "--api-key", "--address", "--place-by-role"}


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def prepared(cfg: dict) -> dict:
    full = prepare_config(copy.deepcopy(cfg))
    validate_config(full)
    return full


def test_validates_against_the_launcher_schema(raw):
    full = prepared(raw)
    assert full["provider"]["type"] == "aws"
    assert full["head_node_type"] == "head"
    # prepare_config merged the common setup commands into the per-role lists.
    assert full["worker_setup_commands"][: len(raw["setup_commands"])] == raw["setup_commands"]


def test_raw_yaml_alone_is_not_enough(raw):
    """Why the test prepares first: the launcher's validator wants the filled-in config."""
    with pytest.raises(RuntimeError, match="cluster_synced_files"):
        validate_config(copy.deepcopy(raw))


@pytest.mark.parametrize("mutate,error", [
    (lambda c: c["available_node_types"]["prefill_gpu"]["resources"].update(GPU=0.5), jsonschema.ValidationError),
    (lambda c: c["available_node_types"]["decode_gpu"]["labels"].update({TOR_LABEL: 3}), jsonschema.ValidationError),
    (lambda c: c["available_node_types"]["decode_gpu"].update(min_worker=1), jsonschema.ValidationError),
    (lambda c: c.update(head_node_type="nope"), ValueError),
    (lambda c: c.update(max_workers=1), ValueError),
], ids=["fractional-gpu", "int-label", "typo", "head-type", "max-workers"])
def test_the_check_catches_mistakes(raw, mutate, error):
    cfg = copy.deepcopy(raw)
    mutate(cfg)
    with pytest.raises(error):
        prepared(cfg)


def test_gpu_worker_types_carry_role_and_topology(raw):
    types = raw["available_node_types"]
    assert set(types) == {"head", "prefill_gpu", "decode_gpu"}
    assert "GPU" not in types["head"]["resources"]
    assert types["head"]["labels"]["raypd.io/role"] == "head"
    for role in ("prefill", "decode"):
        t = types[f"{role}_gpu"]
        res = t["resources"]
        assert isinstance(res["GPU"], int) and res["GPU"] >= 1
        assert res[f"{role}_gpu"] == res["GPU"]            # role capacity counts GPUs
        assert t["labels"]["raypd.io/role"] == role
        assert {TOR_LABEL, SPINE_LABEL} <= set(t["labels"])  # what the Conductor's topology reads
        assert 1 <= t["min_workers"] <= t["max_workers"]


@pytest.mark.parametrize("node_type", ["head", "prefill_gpu", "decode_gpu"])
def test_labels_and_resources_survive_the_trip_to_ray_start(raw, node_type, monkeypatch):
    """The updater exports a node type's resources and labels as JSON env vars around the start
    command; run that shell prefix and parse the result the way `ray start` does."""
    t = raw["available_node_types"][node_type]
    env = {ray_constants.RESOURCES_ENVIRONMENT_VARIABLE: t["resources"],
           ray_constants.LABELS_ENVIRONMENT_VARIABLE: t["labels"]}
    script = _with_environment_variables(
        f"printenv {ray_constants.RESOURCES_ENVIRONMENT_VARIABLE} {ray_constants.LABELS_ENVIRONMENT_VARIABLE}", env)
    res_json, labels_json = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                                           check=True, timeout=30).stdout.splitlines()
    monkeypatch.setenv(ray_constants.RESOURCES_ENVIRONMENT_VARIABLE, res_json)
    monkeypatch.setenv(ray_constants.LABELS_ENVIRONMENT_VARIABLE, labels_json)
    assert ResourceAndLabelSpec._load_env_resources() == t["resources"]
    labels = ResourceAndLabelSpec._load_env_labels()
    assert labels == t["labels"]
    assert label_utils.parse_node_labels_json(json.dumps(labels)) == labels   # no ray.io/ prefix, strings
    for key, value in labels.items():
        assert label_utils.validate_label_key(key) is None, key
        label_utils.validate_label_value(value)


def metrics_port(commands: list[str]) -> int:
    (port,) = {int(p) for c in commands for p in re.findall(r"--metrics-export-port[= ](\d+)", c)}
    return port


def test_start_commands_export_metrics_below_the_worker_ports(raw):
    head, workers = raw["head_start_ray_commands"], raw["worker_start_ray_commands"]
    port = metrics_port(head)
    assert port == metrics_port(workers)
    assert port < RAY_MIN_WORKER_PORT
    assert port not in (6379, 8076, 8265, 8000)     # GCS, object manager, dashboard, Serve
    start = " ".join(head)
    assert "--head" in start and "--dashboard-host=0.0.0.0" in start
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in start
    assert "--address=$RAY_HEAD_IP:6379" in " ".join(workers)


def test_setup_installs_cuda_torch_then_raypd_from_the_spec(raw):
    cmds = raw["setup_commands"]
    torch = next(i for i, c in enumerate(cmds) if "torch==2.13.0" in c)
    raypd = next(i for i, c in enumerate(cmds) if "RAYPD_PIP_SPEC" in c)
    assert torch < raypd
    assert "--index-url" not in cmds[torch]        # PyPI's Linux wheel: the CUDA build
    default = re.search(r"\$\{RAYPD_PIP_SPEC:-([^}]+)\}", cmds[raypd]).group(1)
    assert default.replace("$HOME", "/home/ray") in raw["file_mounts"]   # the copied checkout
    assert raw["file_mounts"]["/home/ray/raypd"] == "."
    assert {".git", ".venv"} <= set(raw["rsync_exclude"])
    assert "--env=RAYPD_PIP_SPEC=" in raw["docker"]["run_options"]


def documented_serve_argv(raw) -> list[str]:
    argv = shlex.split(raw["metadata"]["raypd_serve"])
    assert argv[:2] == ["raypd", "serve"]
    return argv[2:]


def parsed_serve_args(raw):
    from raypd.cluster.cli.main import build_parser

    return build_parser().parse_args(["serve", *documented_serve_argv(raw)])


def test_documented_start_command_fits_the_node_types(raw):
    argv = documented_serve_argv(raw)
    assert {a.split("=")[0] for a in argv if a.startswith("--")} <= SERVE_FLAGS
    args = parsed_serve_args(raw)
    assert args.address == "auto"
    types = raw["available_node_types"]
    assert 1 <= args.prefill_nodes <= types["prefill_gpu"]["min_workers"]
    assert 1 <= args.decode_nodes <= types["decode_gpu"]["min_workers"]
    assert args.gpus_per_node == types["prefill_gpu"]["resources"]["GPU"] == types["decode_gpu"]["resources"]["GPU"]
    assert args.host == "0.0.0.0"
    # Actors go to the machines labelled for their role, and those labels exist on the node types.
    assert args.place_by_role
    assert types["prefill_gpu"]["labels"]["raypd.io/role"] == "prefill"
    assert types["decode_gpu"]["labels"]["raypd.io/role"] == "decode"


def test_documented_start_command_parses_into_a_serve_config(raw):
    from raypd.cluster.cli.serve import config_from_args

    config = config_from_args(parsed_serve_args(raw))
    assert config.place_by_role and config.cluster_spec().place_by_role
