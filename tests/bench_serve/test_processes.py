"""A started system is stopped with everything under it, checked by pid: also a child that ignores
SIGTERM and one that left the process group (as Ray's workers do), and also when it fails to start."""
from __future__ import annotations

import sys
import textwrap

import psutil
import pytest

from raypd.benchmarks.serve.systems import Launched, LaunchError, free_port

# The tail of each fake system: serve GET /v1/models on port argv[1] until stopped.
SERVE_MODELS = textwrap.dedent("""
    import http.server, json, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "m"}]}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")

# Serves GET /v1/models after starting two children: one in the group that ignores SIGTERM, one in a
# session of its own that SIGTERM to the group cannot reach.
FAKE_SYSTEM = textwrap.dedent("""
    import http.server, json, subprocess, sys
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    subprocess.Popen([sys.executable, "-c", ignore])
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
""") + SERVE_MODELS


def test_stop_leaves_no_process(tmp_path):
    port = free_port()
    sysm = Launched.start("fake", [sys.executable, "-c", FAKE_SYSTEM, str(port)], port, tmp_path / "fake.log")
    try:
        sysm.wait_ready(60)
        sysm.remember()
        pids = set(sysm.seen)
        assert len(pids) >= 3, sysm.log_tail()
    finally:
        left = sysm.stop(grace_s=2)
    assert left == []
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_failed_start_is_reported_and_stopped(tmp_path):
    port = free_port()
    sysm = Launched.start("broken", [sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"], port,
                          tmp_path / "broken.log")
    with pytest.raises(LaunchError, match="exited with 3(.|\n)*no model here"):
        sysm.wait_ready(60)
    assert sysm.stop(grace_s=1) == []


# Answers every connection with an HTTP/2 SETTINGS frame, as the gRPC server that took a picked port did in CI.
NOT_HTTP = textwrap.dedent("""
    import socket, sys
    srv = socket.create_server(("127.0.0.1", int(sys.argv[1])))
    while True:
        conn, _ = srv.accept()
        conn.sendall(bytes.fromhex("000006040000000000000500004000") + b"\\r\\n")
        conn.close()
""")


def test_a_port_answering_in_another_protocol_is_a_launch_error(tmp_path):
    port = free_port()
    sysm = Launched.start("grpc", [sys.executable, "-c", NOT_HTTP, str(port)], port, tmp_path / "grpc.log")
    try:
        with pytest.raises(LaunchError, match=f"port {port} answers but not with HTTP"):
            sysm.wait_ready(60)
    finally:
        assert sysm.stop(grace_s=1) == []


def test_a_picked_port_is_outside_the_ranges_others_are_handed():
    from raypd.benchmarks.serve.ports import RAY_WORKER_PORTS, ephemeral_ports

    for _ in range(20):
        port = free_port()
        assert port not in ephemeral_ports() and port not in RAY_WORKER_PORTS
    assert 8100 <= free_port(8100, 10001) <= 10001


# On SIGTERM, writes whether its child (a daemon it started, as raypd serve starts Ray's GCS) is still
# alive, stops the child itself and exits.
ORDERLY_SYSTEM = textwrap.dedent("""
    import http.server, json, signal, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    def on_term(signum, frame):
        open(sys.argv[2], "w").write("alive" if child.poll() is None else "gone")
        child.kill(); child.wait(); sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
""") + SERVE_MODELS


def test_stop_lets_the_system_stop_its_own_daemons_first(tmp_path):
    """SIGTERM reaches the system's own process before anything in its group: `raypd serve` must find
    Ray's GCS and raylet alive to shut Serve down (with them gone it waited 30 s)."""
    port, said = free_port(), tmp_path / "child-at-sigterm"
    sysm = Launched.start("orderly", [sys.executable, "-c", ORDERLY_SYSTEM, str(port), str(said)], port,
                          tmp_path / "orderly.log")
    try:
        sysm.wait_ready(60)
    finally:
        left = sysm.stop(grace_s=30)
    assert said.read_text() == "alive" and left == []
    assert sysm.proc.returncode == 0
