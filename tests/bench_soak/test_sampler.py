"""The process sampler against this test's own processes: a "server" in a session of its own whose
child opens files and threads and whose grandchild leaves the tree (double fork), and an outsider
that only names a marker. Every process started here is killed by pid at the end. Like
tests/bench_serve/test_processes.py, these start only a few idle Pythons, for seconds."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from raypd.benchmarks.soak.processes import role_of, session_members, unique_labels
from raypd.benchmarks.soak.sampler import ProcessSampler

# The "server": starts a worker holding 20 files and 3 extra threads, and a daemon that double-forks
# out of the tree (as Ray's workers can leave the server's tree), then waits.
SERVER = textwrap.dedent("""
    import os, subprocess, sys, time
    worker = '''
    import threading, time
    files = [open("/dev/null") for _ in range(20)]
    for _ in range(3):
        threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(120)
    '''
    w = subprocess.Popen([sys.executable, "-c", worker, "soak-test-worker"], stdout=subprocess.PIPE, text=True)
    w.stdout.readline()
    if os.fork() == 0:
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", "soak-test-orphan"])
        os._exit(0)
    os.wait()
    print(w.pid, flush=True)
    time.sleep(120)
""")


@pytest.fixture
def family():
    """(server pid, worker pid, the outsider's pid, marker); every process of it killed afterwards."""
    marker = f"soak-marker-{os.getpid()}"
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker],
                                start_new_session=True)
    try:
        worker_pid = int(server.stdout.readline())
        yield server.pid, worker_pid, outsider.pid, marker
    finally:
        pids = [p.pid for p in psutil.process_iter() if _sid(p.pid) == server.pid] + [server.pid, outsider.pid]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        server.wait(10)
        outsider.wait(10)


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _wait_dead(pid: int) -> None:
    """Until `pid` is gone or a zombie (its parent, the fake server, does not reap it)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} did not die")


def _orphan_pid(server_pid: int) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["pid", "cmdline"]):
            if "soak-test-orphan" in (p.info["cmdline"] or []) and _sid(p.info["pid"]) == server_pid:
                return p.info["pid"]
        time.sleep(0.1)
    raise AssertionError("the double-forked process did not start")


def test_members_are_the_session_its_leavers_and_marked_outsiders(family):
    server, worker, outsider, marker = family
    orphan = _orphan_pid(server)
    assert server not in {a.pid for a in psutil.Process(orphan).parents()}  # it left the server's tree
    assert set(session_members(server)) == {server, worker, orphan}
    assert set(session_members(server, [marker])) == {server, worker, orphan, outsider}


def test_a_sample_reads_rss_fds_and_threads_per_process(family):
    server, worker, _, _ = family
    sampler = ProcessSampler(server)
    assert sampler.sample(0.0, names={worker: "raypd-prefill-0"}) == 3
    assert sampler.sample(5.0) == 3
    w = sampler.series[worker]
    assert w.t_s == [0.0, 5.0] and w.name == "raypd-prefill-0" and w.label == "raypd-prefill-0"
    assert all(f >= 23 for f in w.fds)             # stdin/out/err + 20 files
    assert all(t >= 4 for t in w.threads)          # main + 3
    assert all(r > 1 << 20 for r in w.rss)
    assert sampler.series[server].role == "serve-cli"
    assert set(sampler.labelled()) == {"serve-cli", "raypd-prefill-0", os.path.basename(sys.executable)}
    os.kill(worker, signal.SIGKILL)
    _wait_dead(worker)
    assert sampler.sample(10.0) == 2
    assert sampler.series[worker].t_s == [0.0, 5.0]  # a process gone keeps its samples, gets no more


def test_reset_forgets_samples_but_not_names(family):
    server, worker, _, _ = family
    sampler = ProcessSampler(server)
    sampler.sample(0.0, names={worker: "raypd-decode-0"})
    sampler.reset()
    assert sampler.labelled() == {} and sampler.times == []
    sampler.sample(1.0)
    assert sampler.series[worker].name == "raypd-decode-0" and sampler.series[worker].t_s == [1.0]


@pytest.mark.parametrize("cmdline, role", [
    (["/v/ray/core/src/ray/gcs/gcs_server", "--log_dir=/tmp/ray/session_x/logs"], "gcs"),
    (["/v/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=/tmp/ray/session_x/sockets/raylet"], "raylet"),
    (["ray::PrefillNode.attach_conductor"], "PrefillNode"),
    (["ray::Conductor"], "Conductor"),
    (["ray::ServeReplica:raypd:OpenAIIngress.initialize_and_get_metadata"], "OpenAIIngress"),
    (["ray::ServeController.listen_for_change"], "ServeController"),
    (["ray::IDLE"], "idle-worker"),
    (["ray-dashboard-NodeHead-0 (/v/bin/python -B -c \"from multiprocessing.forkserver import main\")"],
     "dashboard:NodeHead"),
    (["/v/bin/python", "/v/ray/dashboard/dashboard.py", "--host=127.0.0.1"], "dashboard"),
    (["/v/bin/python", "-u", "/v/ray/autoscaler/_private/monitor.py", "--logs-dir=x"], "autoscaler-monitor"),
    (["/v/bin/python", "-u", "/v/ray/_private/log_monitor.py"], "log-monitor"),
    (["/v/bin/python", "-B", "-c", "from multiprocessing.resource_tracker import main;main(25)"], "resource-tracker"),
    (["/v/bin/python", "/v/ray/_private/workers/default_worker.py", "--node-ip-address=x"], "worker"),
    (["/usr/bin/something", "--flag"], "something"),
    ([], "pid-42"),
])
def test_roles_from_command_lines(cmdline, role):
    assert role_of(cmdline, 42, server_pid=1) == role


def test_the_server_pid_is_the_cli_and_repeated_labels_are_numbered_by_age():
    assert role_of(["/v/bin/python", "-m", "raypd", "serve"], 7, server_pid=7) == "serve-cli"
    labels = unique_labels({10: "PrefillNode", 11: "PrefillNode", 12: "gcs", 13: "PrefillNode"},
                           {10: 3.0, 11: 1.0, 12: 0.0, 13: 2.0})
    assert labels == {11: "PrefillNode", 13: "PrefillNode#2", 10: "PrefillNode#3", 12: "gcs"}
