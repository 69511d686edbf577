"""cluster/cluster.local.yaml for `ray up` on premises, checked offline with the installed Ray's cluster
launcher, as tests/deploy/test_cluster_yaml.py checks the AWS file (the same private Ray APIs, pinned
to the Ray in the venv).

The local provider has one node type for every machine and hands `ray start` no labels, so the yaml's
start commands give each machine its labels: the worker command looks its address up in a table.
These tests run each start command in bash as the launcher's ssh session would (with $SSH_CONNECTION
naming the machine's address) against a stand-in `ray` that prints its arguments, and parse the labels
the way `ray start` does. tests/lab/test_ray_up_local.py runs the file for real on the lab.
"""
from __future__ import annotations

import copy
import json
import re
import subprocess

import click
import jsonschema
import pytest
import yaml
from ray._private import label_utils
from ray.autoscaler._private.local.config import LOCAL_CLUSTER_NODE_TYPE

from raypd.cluster.launch.placement import ROLE_LABEL
from raypd.conductor.topology import SPINE_LABEL, TOR_LABEL
from tests.deploy.conftest import CLUSTER_LOCAL_YAML, CLUSTER_YAML, REPO
from tests.deploy.test_cluster_yaml import (
    RAY_MIN_WORKER_PORT,
    SERVE_FLAGS,
    documented_serve_argv,
    metrics_port,
    parsed_serve_args,
    prepared,
)

HEAD_IP = "192.0.2.10"


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(CLUSTER_LOCAL_YAML.read_text())


def start(command: str, node_ip: str) -> tuple[int, dict[str, str], str]:
    """Run a start command as the launcher's ssh session to `node_ip` would, `ray` a stand-in: its exit
    status, the `--flag=value` arguments `ray start` got, and stderr."""
    stub = 'ray() { printf "%s\\n" "$@" "--autoscaler-v2=${RAY_enable_autoscaler_v2-unset}"; }; '
    env = {"PATH": "/usr/bin:/bin", "SSH_CONNECTION": f"192.0.2.200 50022 {node_ip} 22", "RAY_HEAD_IP": HEAD_IP}
    done = subprocess.run(["bash", "-c", stub + command], capture_output=True, text=True, env=env, timeout=30)
    args = dict(a.split("=", 1) for a in done.stdout.splitlines() if a.startswith("--") and "=" in a)
    return done.returncode, args, done.stderr


def started_labels(args: dict[str, str]) -> dict[str, str]:
    labels = label_utils.parse_node_labels_string(args["--labels"])
    label_utils.validate_node_labels(labels)     # no ray.io/ prefix
    for key, value in labels.items():
        assert label_utils.validate_label_key(key) is None, key
        label_utils.validate_label_value(value)
    return labels


def table_rows(raw) -> list[str]:
    """The addresses in the worker start command's table."""
    return re.findall(r"(?:^|\s)([0-9.]+)\)", raw["worker_start_ray_commands"][-1])


def test_validates_against_the_launcher_schema(raw):
    full = prepared(raw)
    assert full["provider"]["type"] == "local"
    # The local provider's one node type, every listed worker in it.
    assert full["head_node_type"] == LOCAL_CLUSTER_NODE_TYPE
    (node_type,) = full["available_node_types"].values()
    n = len(raw["provider"]["worker_ips"])
    assert node_type["min_workers"] == node_type["max_workers"] == full["max_workers"] == n
    assert full["worker_setup_commands"] == raw["setup_commands"] == full["head_setup_commands"]


@pytest.mark.parametrize("mutate,error", [
    (lambda c: c.update(available_node_types={"prefill": {"resources": {}, "node_config": {}}}),
     click.ClickException),
    (lambda c: c["provider"].pop("worker_ips"), click.ClickException),
    (lambda c: c["provider"].update(worker_ips="192.0.2.11"), jsonschema.ValidationError),
    (lambda c: c["auth"].update(ssh_private_keys="~/.ssh/id_ed25519"), jsonschema.ValidationError),
    (lambda c: c.update(head_start_ray_command=[]), jsonschema.ValidationError),
], ids=["node-types", "no-worker-ips", "ips-not-a-list", "auth-typo", "typo"])
def test_the_check_catches_mistakes(raw, mutate, error):
    cfg = copy.deepcopy(raw)
    mutate(cfg)
    with pytest.raises(error):
        prepared(cfg)


def test_every_worker_has_one_row_and_every_row_a_worker(raw):
    rows = table_rows(raw)
    assert sorted(rows) == sorted(raw["provider"]["worker_ips"])
    assert len(set(rows)) == len(rows)
    assert HEAD_IP == raw["provider"]["head_ip"] not in rows


def test_each_worker_starts_with_its_rows_labels_at_its_address(raw):
    command = raw["worker_start_ray_commands"][-1]
    roles = []
    for ip in raw["provider"]["worker_ips"]:
        code, args, err = start(command, ip)
        assert code == 0, err
        assert args["--address"] == f"{HEAD_IP}:6379"
        assert args["--node-ip-address"] == ip
        labels = started_labels(args)
        assert {ROLE_LABEL, TOR_LABEL, SPINE_LABEL} <= set(labels)   # what placement and the topology read
        roles.append(labels[ROLE_LABEL])
    assert sorted(roles) == ["decode", "prefill"]


def test_a_machine_without_a_row_does_not_start_and_says_so(raw):
    code, args, err = start(raw["worker_start_ray_commands"][-1], "192.0.2.99")
    assert code == 1 and args == {}
    assert "no row for 192.0.2.99" in err


def test_the_head_starts_labelled_head_with_the_v1_autoscaler(raw):
    code, args, err = start(raw["head_start_ray_commands"][-1], HEAD_IP)
    assert code == 0, err
    assert args["--node-ip-address"] == HEAD_IP
    assert started_labels(args) == {ROLE_LABEL: "head", TOR_LABEL: "tor-1", SPINE_LABEL: "spine-0"}
    assert args["--autoscaler-v2"] == "0"       # ray-project/ray#57153: v2 has no local provider
    assert args["--autoscaling-config"] == "~/ray_bootstrap_config.yaml"
    assert raw["head_start_ray_commands"][0] == raw["worker_start_ray_commands"][0] == "ray stop"


def test_the_workers_stop_reaches_every_worker_with_the_bootstrap_key(raw):
    """metadata.stop_workers on the head, `ray` and `ssh` stand-ins: one ssh per worker the launcher
    knows (`ray get-worker-ips` of the head's bootstrap config), with the key the launcher put there,
    running `ray stop` in an interactive shell (which sources ~/.bashrc, where the venv is activated)."""
    workers = raw["provider"]["worker_ips"]
    stubs = ('ray() { [ "$*" = "get-worker-ips $HOME/ray_bootstrap_config.yaml" ] && '
             f'printf "%s\\n" {" ".join(workers)}; }}; ssh() {{ printf "%s|" "$@"; echo; }}; ')
    env = {"PATH": "/usr/bin:/bin", "HOME": "/home/op", "USER": "op"}
    done = subprocess.run(["bash", "-c", stubs + raw["metadata"]["stop_workers"]], capture_output=True, text=True,
                          env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    calls = [line.split("|")[:-1] for line in done.stdout.splitlines()]
    assert [c[-2] for c in calls] == [f"op@{ip}" for ip in workers]
    for c in calls:
        assert c[c.index("-i") + 1] == "/home/op/ray_bootstrap_key.pem"
        assert "BatchMode=yes" in c and c[-1] == 'bash -ic "ray stop"'


def test_ports_are_those_of_the_aws_file(raw):
    aws = yaml.safe_load(CLUSTER_YAML.read_text())
    head, workers = raw["head_start_ray_commands"], raw["worker_start_ray_commands"]
    port = metrics_port(head)
    assert port == metrics_port(workers) == metrics_port(aws["head_start_ray_commands"]) < RAY_MIN_WORKER_PORT
    for commands in (head, workers):
        assert "--object-manager-port=8076" in " ".join(commands)
    assert "--head --port=6379" in " ".join(head) and "--dashboard-host=0.0.0.0" in " ".join(head)


def test_setup_makes_a_venv_that_login_shells_activate_then_installs_the_checkout(raw):
    cmds = raw["setup_commands"]
    venv = next(i for i, c in enumerate(cmds) if "-m venv ~/raypd-venv" in c)
    activate = next(i for i, c in enumerate(cmds) if ">> ~/.bashrc" in c)
    torch = next(i for i, c in enumerate(cmds) if "torch==2.13.0" in c)
    raypd = next(i for i, c in enumerate(cmds) if c.endswith("pip install --quiet ~/raypd"))
    assert venv < activate < torch < raypd
    assert all(c.startswith("~/raypd-venv/bin/pip ") for c in cmds[torch:])
    assert raw["file_mounts"] == {"~/raypd": "."}
    assert {".git", ".venv"} <= set(raw["rsync_exclude"])


def test_documented_start_command_is_the_aws_files_and_fits_the_machines(raw):
    aws = yaml.safe_load(CLUSTER_YAML.read_text())
    assert raw["metadata"]["raypd_serve"] == aws["metadata"]["raypd_serve"]
    assert {a.split("=")[0] for a in documented_serve_argv(raw) if a.startswith("--")} <= SERVE_FLAGS
    args = parsed_serve_args(raw)
    assert args.address == "auto" and args.place_by_role and args.host == "0.0.0.0"
    roles = [started_labels(start(raw["worker_start_ray_commands"][-1], ip)[1])[ROLE_LABEL]
             for ip in raw["provider"]["worker_ips"]]
    assert 1 <= args.prefill_nodes <= roles.count("prefill")
    assert 1 <= args.decode_nodes <= roles.count("decode")


def test_the_file_ships_with_the_package():
    # pyproject's [tool.setuptools.package-data] line (a TOML array of plain strings reads as JSON)
    line = re.search(r'^"raypd\.cluster" = (\[.*\])', (REPO / "pyproject.toml").read_text(), re.M)
    assert {CLUSTER_YAML.name, CLUSTER_LOCAL_YAML.name} <= set(json.loads(line.group(1)))
    assert CLUSTER_LOCAL_YAML.parent == CLUSTER_YAML.parent
