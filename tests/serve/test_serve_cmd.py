"""`raypd serve` as a user runs it: bad options, a port in use and a missing model end with one line
and status 2 before anything starts; SIGTERM while it starts up still stops Ray and every process;
and the Serve app builder reads its args (the package's server fixture covers SIGINT when running)."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.serve.conftest import ServerProcess, free_port

pytestmark = pytest.mark.cluster  # starts Ray, a server or other processes


def serve_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raypd.cluster.cli.main", "serve", *args], capture_output=True, text=True,
                          timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess, starts: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"raypd serve: error: {starts}"), proc.stderr[-2000:]


def test_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = serve_cli("--port", str(port))
    assert_one_line_error(proc, f"127.0.0.1:{port} is already in use")


@pytest.mark.parametrize("args,starts", [
    (("--model", "/no/such/model"), "model path does not exist"),
    (("--prefill-nodes", "1", "--decode-nodes", "0"), "PD needs at least one prefill node"),
    (("--mixed-nodes", "1", "--prefill-nodes", "1", "--decode-nodes", "1"), "run either"),
    (("--policy", "fastest"), "unknown policy 'fastest'"),
    (("--topology", "/no/such/topology.yaml"), "topology file not found"),
    (("--port", "70000"), "--port 70000 is out of range"),
    (("--metrics-export-port", "18080"), "--metrics-export-port 18080 is in Ray's worker port range"),
    (("--gpus-per-node", "2"), "--gpus-per-node 2.0: a node actor uses one GPU"),
    (("--gpu-memory-utilization", "1.5"), "engine options: gpu_memory_utilization must be in (0, 1]"),
], ids=["model", "pd-counts", "pd-and-mixed", "policy", "topology", "port-range", "metrics-port", "gpus",
        "gpu-memory"])
def test_bad_options(args, starts):
    assert_one_line_error(serve_cli("--port", str(free_port()), *args), starts)


def test_sigterm_while_starting_stops_everything(tmp_path):
    srv = ServerProcess.start(tmp_path / "serve.log", "--no-dashboard")
    try:
        deadline = time.monotonic() + 120
        while "starting 2 node(s)" not in srv.log():  # Ray and Serve are up, the nodes are loading
            assert srv.proc.poll() is None and time.monotonic() < deadline, srv.log()[-3000:]
            srv.remember_descendants()
            time.sleep(0.2)
        time.sleep(2)
        srv.stop(signal.SIGTERM)  # asserts exit status 0 and no process left behind
    except BaseException:
        srv.kill()
        raise
    assert "stopped" in srv.log().splitlines()[-1]


def test_app_builder_reads_serve_config_args(monkeypatch):
    from ray.serve import Application

    from raypd.cluster.serve.config import ServeConfig, ServeConfigError
    from raypd.cluster.serve_app import app_builder

    monkeypatch.setenv("RAYPD_API_KEY", "k")
    app = app_builder({"prefill_nodes": "2", "decode_nodes": "2", "policy": "cost"})
    assert isinstance(app, Application)
    # The key never comes from the args: a Serve config file's args show in the Ray dashboard.
    with pytest.raises(ServeConfigError, match="RAYPD_API_KEY"):
        app_builder({"prefill_nodes": "2", "decode_nodes": "2", "api_key": "k"})
    cfg = ServeConfig.from_args({"mixed_nodes": 2})
    assert cfg.cluster_spec().roles() == ["mixed", "mixed"]
    with pytest.raises(ServeConfigError, match="unknown raypd app args: prefil_nodes"):
        ServeConfig.from_args({"prefil_nodes": 1})


def test_a_serve_already_running_elsewhere_on_the_cluster_is_named_not_ignored():
    """Serve keeps the HTTP options it first started with; joining a cluster whose Serve listens
    elsewhere, raypd serve fails naming that endpoint instead of printing one nobody listens on."""
    from ray.serve.config import HTTPOptions

    from raypd.cluster.cli.serve import ServeStartError, check_serve_http

    check_serve_http("127.0.0.1", 8000, HTTPOptions(host="127.0.0.1", port=8000))
    with pytest.raises(ServeStartError, match=r"HTTP endpoint on 127\.0\.0\.1:8001.*--host 127\.0\.0\.1 --port 8001"):
        check_serve_http("127.0.0.1", 8000, HTTPOptions(host="127.0.0.1", port=8001))
