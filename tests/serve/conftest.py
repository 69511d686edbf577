"""A real `raypd serve` subprocess (local Ray, 1 prefill + 1 decode node over NIXL, two ingress
replicas, an API key, Ray's Prometheus endpoint on a known port) shared by the HTTP tests of this
package, and helpers to talk to it.

The server is started once for the package (it costs ~30-60 s here) and stopped with SIGINT at the
end; stopping checks that every process it started (Ray's included) is gone.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from raypd.benchmarks.serve.ports import free_port

API_KEY = "test-key"
MODEL = "SmolLM2-135M-Instruct.Q4_1"
MAX_BODY_BYTES = 256 * 1024
DEFAULT_MAX_TOKENS = 32
# Ray exports metrics every 10 s by default; 1 s lets the metrics test see its requests soon.
METRICS_ENV = {"RAY_metrics_report_interval_ms": "1000"}


def free_port_below_10002() -> int:
    """For Ray's metrics export port: ports from 10002 up are Ray's worker ports (Ray fails to start)."""
    return free_port(8100, 10001)


@dataclass
class ServerProcess:
    """One `raypd serve` subprocess, its log file and every process under it."""
    port: int
    log_path: Path
    proc: subprocess.Popen
    descendants: list = field(default_factory=list)
    metrics_port: int | None = None

    @classmethod
    def start(cls, log_path: Path, *args: str, port: int | None = None, metrics_port: int | None = None,
              env: dict[str, str] | None = None) -> ServerProcess:
        port = port or free_port()
        log = open(log_path, "w")
        cmd = [sys.executable, "-m", "raypd.cluster.cli.main", "serve", "--port", str(port), *args]
        if metrics_port:
            cmd += ["--metrics-export-port", str(metrics_port)]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "RAYPD_API_KEY": "", **(env or {})})
        return cls(port, log_path, proc, metrics_port=metrics_port)

    @classmethod
    @contextlib.contextmanager
    def running(cls, log_path: Path, *args: str, **kw) -> Iterator[ServerProcess]:
        """start() and wait until ready; then the caller's block. Stopped by signal (then by pid)
        however it ends, also when it never got ready."""
        srv = cls.start(log_path, *args, **kw)
        try:
            srv.wait_ready()
            srv.remember_descendants()
        except BaseException:
            srv.kill()
            raise
        try:
            yield srv
        finally:
            srv.stop(signal.SIGINT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"raypd serve exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            if "ready; Ctrl-C stops everything" in self.log():
                status, _, _ = request(self.port, "GET", "/health")
                if status == 200:
                    return
            self.remember_descendants()
            time.sleep(0.5)
        raise AssertionError(f"raypd serve not ready within {timeout_s:.0f}s:\n{self.log()[-4000:]}")

    def remember_descendants(self) -> None:
        """Every process under the server so far (Ray's workers re-parent away once their raylet dies)."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        known = {p.pid for p in self.descendants}
        self.descendants += [k for k in kids if k.pid not in known]

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 90.0) -> None:
        """Signal the server; assert it exits 0 and leaves no process of its own behind."""
        self.remember_descendants()
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"raypd serve did not stop within {timeout_s:.0f}s of {sig!r}; its log ends "
                                 f"(a stuck clean-up logs every thread's stack):\n{self.log()[-12000:]}") from None
        deadline = time.monotonic() + 30
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.5)
        if left:
            names = [(p.pid, p.name()) for p in left]
            self.kill()
            raise AssertionError(f"processes left after raypd serve stopped: {names}")
        assert code == 0, f"raypd serve exited with {code}:\n{self.log()[-3000:]}"

    def leftovers(self) -> list:
        alive = []
        for p in self.descendants:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        return alive

    def kill(self) -> None:
        """Last resort after a failed test: kill exactly the processes this server started."""
        for p in [*self.descendants, psutil.Process(self.proc.pid) if self.proc.poll() is None else None]:
            if p is None:
                continue
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def request(port: int, method: str, path: str, body: bytes | dict | None = None, headers: dict | None = None,
            api_key: str | None = API_KEY, timeout: float = 120.0) -> tuple[int, dict, bytes]:
    """One raw HTTP exchange: (status, headers, body). A dict body is sent as JSON."""
    hdrs = dict(headers or {})
    if api_key is not None:
        hdrs.setdefault("Authorization", f"Bearer {api_key}")
    if isinstance(body, dict):
        body = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    except (ConnectionError, http.client.HTTPException, OSError):
        return 0, {}, b""
    finally:
        conn.close()


def replicas_answering(client, tries: int = 12) -> set[str]:
    """The ingress replicas (x-raypd-replica) that answered one-token requests sent one after another,
    until two have or `tries` were sent. Serve's router spreads by the queue lengths it last heard
    from each replica (kept 10 s), so this also leaves both fresh there."""
    seen: set[str] = set()
    for _ in range(tries):
        raw = client.completions.with_raw_response.create(model=MODEL, prompt="Hi", max_tokens=1, temperature=0)
        seen.add(raw.headers["x-raypd-replica"])
        if len(seen) > 1:
            break
    return seen


def node_report(port: int) -> list[dict]:
    status, _, body = request(port, "GET", "/admin/nodes")
    assert status == 200, body
    return json.loads(body)["nodes"]


def wait_nodes_idle(port: int, timeout_s: float = 30.0) -> list[dict]:
    """Until every node holds nothing (no request, room, stream, reservation) and all its blocks are
    free or reusable cache; the accounting check runs on every poll."""
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = node_report(port)
        busy = [n for n in nodes if not n.get("idle") or n["load"]["free_blocks"] != n["load"]["total_blocks"]]
        if not busy:
            return nodes
        if time.monotonic() > deadline:
            raise AssertionError(f"nodes still hold state: {busy}")
        time.sleep(0.2)


@pytest.fixture(scope="package")
def server(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("serve") / "raypd-serve.log"
    # 512 MB of KV per node (728 blocks: 11,648 tokens, more than the model's 8,192-token context) instead
    # of the CPU default of 1 GiB: the pool's pages are touched at start, and the other xdist worker's
    # Ray clusters share this machine's memory (Ray's OOM killer once took a node here at start-up).
    with ServerProcess.running(log_path, "--api-key", API_KEY, "--ingress-replicas", "2", "--no-dashboard",
                               "--kv-cache-memory", "512",
                               "--max-body-bytes", str(MAX_BODY_BYTES), "--default-max-tokens", str(DEFAULT_MAX_TOKENS),
                               metrics_port=free_port_below_10002(), env=METRICS_ENV) as srv:
        yield srv


@pytest.fixture(scope="package")
def base_url(server) -> str:
    return f"http://127.0.0.1:{server.port}/v1"


@pytest.fixture
def client(base_url):
    from openai import OpenAI

    with OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=120) as c:
        yield c
