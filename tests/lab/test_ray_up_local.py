"""`ray up` on premises (issue 32, item 6): cluster/cluster.local.yaml on a lab of machines reached
over ssh (benchmarks/lab/ssh_hosts.py: sshd in each host, each with its own process table, /tmp and
home), driven from an operator's machine without Ray as docs/deploy.md says: `ray up -y` brings up the
head, whose autoscaler starts both workers over ssh, each Ray node at its address with the labels the
yaml's table gives it; `raypd serve --place-by-role`, started on the head with `ray exec`, answers the
openai client on the head with the engine's own greedy text; stopping it, then Ray on the workers
(both with `ray exec`, `ray down` reaching the head only: ray-project/ray#17022), then `ray down -y`
leave no Ray or raypd process on any machine, and nothing of the launcher's outside the lab.

The yaml is the shipped one with its addresses, ssh user and key replaced, and without the file
mounts and setup commands that would install raypd (the lab's machines share this Python); its start
commands and its metadata's commands run as shipped. The model is the tiny random one
(tests/tiny_model.py): what is checked is the launcher's path."""
from __future__ import annotations

import json
import re
import shlex
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from raypd.benchmarks.lab import ssh_hosts
from raypd.benchmarks.lab.hosts import Host, Lab, LabSpec, unavailable_reason
from raypd.benchmarks.lab.ssh_hosts import SshHosts
from raypd.cluster.launch.placement import ROLE_LABEL

pytestmark = [pytest.mark.cluster,  # starts Ray and raypd inside the lab's hosts
              pytest.mark.skipif(unavailable_reason() is not None, reason=f"no lab here: {unavailable_reason()}"),
              pytest.mark.skipif(ssh_hosts.unavailable_reason() is not None,
                                 reason=f"no sshd for the lab: {ssh_hosts.unavailable_reason()}")]

SHIPPED = Path(__file__).resolve().parents[2] / "cluster" / "cluster.local.yaml"
CONFIG = "cluster.local.yaml"          # in the operator's home
PROMPT = "Tell me about the lighthouse."
MAX_TOKENS = 12
# The lab's machines' environment: UCX without a same-machine shortcut (CMA, shared memory) between
# the hosts, which share one kernel; no usage report (nothing outside the lab is reachable).
ENV = {"UCX_TLS": "tcp,self", "RAY_USAGE_STATS_ENABLED": "0"}
# The Ray nodes alive, asked on the head: [address, role label] each, on a line of its own (the
# driver prints the autoscaler's events too).
NODES = ("python -c \"import json, ray; ray.init(address='auto', logging_level='ERROR'); "
         f"print('nodes:', json.dumps(sorted([n['NodeManagerAddress'], n['Labels'].get('{ROLE_LABEL}')] "
         "for n in ray.nodes() if n['Alive'])))\"")
READY = "ready; Ctrl-C stops everything"
CLIENT = textwrap.dedent("""
    import json, sys
    from openai import OpenAI
    client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": sys.argv[2]}],
                                       max_tokens=int(sys.argv[3]), temperature=0, extra_body={"ignore_eos": True})
    print(json.dumps(r.choices[0].message.content))
""")
# Processes of Ray or raypd, by command line: Ray's daemons and its Python processes, its workers'
# titles, and the raypd CLI.
RAY_OR_RAYPD = re.compile(r"raylet|gcs_server|/site-packages/ray/|^ray::|raypd serve")


def lab_config(shipped: str, head: Host, workers: list[Host], key: Path) -> str:
    """The shipped yaml with the lab's addresses (everywhere: provider and the start commands' table),
    root with the lab's key, and nothing to install."""
    config = yaml.safe_load(shipped)
    documented = [config["provider"]["head_ip"], *config["provider"]["worker_ips"]]
    assert len(documented) == 1 + len(workers)
    for placeholder, host in zip(documented, [head, *workers], strict=True):
        shipped = shipped.replace(placeholder, host.ip)
    config = yaml.safe_load(shipped)
    config["auth"] = {"ssh_user": "root", "ssh_private_key": str(key)}
    for key_name in ("file_mounts", "rsync_exclude", "setup_commands"):
        del config[key_name]
    return yaml.safe_dump(config, sort_keys=False)


def serve_command(shipped: str, model: str) -> str:
    """metadata.raypd_serve on the lab's CPUs and the tiny model, in the background, its pid in a file."""
    argv = shlex.split(yaml.safe_load(shipped)["metadata"]["raypd_serve"])
    argv[argv.index("--gpus-per-node") + 1] = "0"
    argv += ["--model", model, "--cpus-per-node", "1", "--kv-cache-memory", "64"]
    return f"nohup {shlex.join(argv)} > ~/raypd-serve.log 2>&1 & echo $! > ~/raypd-serve.pid"


def ray_or_raypd(lab: Lab) -> dict[str, list[str]]:
    """The Ray and raypd processes running in each lab host now, by the host's address."""
    found: dict[str, list[str]] = {}
    for host in lab.hosts:
        for pid in lab.pids_in(host.namespace):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:   # gone meanwhile
                continue
            if RAY_OR_RAYPD.search(cmdline):
                found.setdefault(host.ip, []).append(cmdline[:120])
    return found


def launcher_files() -> set[Path]:
    """What `ray up` and Ray write on the machine they run on, had the hosts not their own /tmp and
    home: the cluster's state and lock, the ssh connections, the config cache, the head's bootstrap
    files, the ssh client's folder."""
    home, tmp = Path("/root"), Path("/tmp")
    return {*tmp.glob("ray/cluster-raypd-local.*"), *tmp.glob("ray_ssh_*"), *tmp.glob("ray-config-*"),
            *[p for p in (home / "ray_bootstrap_config.yaml", home / "ray_bootstrap_key.pem", home / ".ssh")
              if p.exists()]}


def poll(check, done, timeout_s: float, interval_s: float = 1.0):
    """check() until done(its value) or timeout_s; the last value (the test asserts on it)."""
    deadline = time.monotonic() + timeout_s
    while not done(value := check()) and time.monotonic() < deadline:
        time.sleep(interval_s)
    return value


@pytest.fixture(scope="module")
def expected(tiny_model_dir) -> str:
    """The request through the engine in this process: the chat template, greedy, ignore_eos."""
    from raypd.engine import LLM, SamplingParams

    llm = LLM(tiny_model_dir, kv_cache_memory_mb=64)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    (out,) = llm.generate([{"messages": [{"role": "user", "content": PROMPT}]}], params)
    return out.text


def test_ray_up_of_the_local_yaml_serves_and_ray_down_leaves_nothing(tiny_model_dir, expected):
    before = launcher_files()
    shipped = SHIPPED.read_text()
    lab = Lab(LabSpec(hosts_per_rack=(4,)))
    with lab:
        head, prefill_host, decode_host, operator = lab.hosts
        machines = SshHosts(lab, shared=[Path(tiny_model_dir)], env=ENV)
        machines.start()
        (machines.root_of(operator) / CONFIG).write_text(lab_config(shipped, head, [prefill_host, decode_host],
                                                                   machines.key))
        (machines.root_of(head) / "client.py").write_text(CLIENT)
        log = machines.root_of(head) / "raypd-serve.log"

        def operator_runs(*argv: str, timeout_s: float = 180) -> None:
            machines.run(operator, shlex.join(argv), timeout_s=timeout_s)

        def alive_nodes() -> list:
            done = machines.run(head, NODES, timeout_s=60, check=False)
            return next((json.loads(line[len("nodes:"):]) for line in done.stdout.splitlines()
                         if line.startswith("nodes:")), [])

        def serving() -> bool:
            return machines.run(head, "kill -0 $(cat ~/raypd-serve.pid)", check=False).returncode == 0

        operator_runs("ray", "up", "-y", "--no-config-cache", CONFIG, timeout_s=300)
        nodes = poll(alive_nodes, lambda n: len(n) == 3, timeout_s=240, interval_s=2)
        operator_runs("ray", "exec", CONFIG, serve_command(shipped, tiny_model_dir))
        poll(lambda: READY in log.read_text(errors="replace") or not serving(), bool, timeout_s=300)
        answer = machines.run(head, shlex.join(["python", "client.py", f"http://{head.ip}:8000", PROMPT,
                                                str(MAX_TOKENS)]), timeout_s=180, check=False)
        operator_runs("ray", "exec", CONFIG, "kill $(cat ~/raypd-serve.pid); "
                      "timeout 120 tail --pid=$(cat ~/raypd-serve.pid) -f /dev/null")
        operator_runs("ray", "exec", CONFIG, yaml.safe_load(shipped)["metadata"]["stop_workers"])
        operator_runs("ray", "down", "-y", CONFIG)
        left = poll(lambda: ray_or_raypd(lab), lambda found: not found, timeout_s=30, interval_s=0.5)
        serve_log = log.read_text(errors="replace")
    assert nodes == sorted([[head.ip, "head"], [prefill_host.ip, "prefill"], [decode_host.ip, "decode"]]), nodes
    assert answer.returncode == 0, f"{answer.stderr[-3000:]}\n{serve_log[-3000:]}"
    assert json.loads(answer.stdout.splitlines()[-1]) == expected
    assert serve_log.rstrip().endswith("stopped"), serve_log[-3000:]
    assert left == {}
    assert (lab.namespaces(), lab.links(), lab.folder.exists()) == ([], [], False)
    assert launcher_files() == before
