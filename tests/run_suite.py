"""`make test`: lint, types and every test, arranged to end soonest on this project's 2-core VMs; prints
the whole run's wall time and exits non-zero if any part failed.

    ruff ─┬─> pytest -n 2, not serial, not compute ──> pytest, serial ─┬─> report
          └─> lowest priority: mypy; pytest -n 2, compute ──────────────┘

- The main run: every test that starts Ray, a server or other processes, and the one-process tests
  with threads or clocks, on two pytest-xdist workers (tests/conftest.py groups and orders them).
  Its tests wait a lot (Ray start-ups, polls, restarts): both workers at once left the cores idle
  ~12% of the run, and a third worker, which filled that, made the cluster tests' timing fail.
- Beside it, at the lowest CPU priority: the type check and the `compute` tests (tests/conftest.py:
  one-process engine tests that only compute, ~270 worker-s) on two workers of their own. Each runs
  at nice 19 in a session of its own whose autogroup is set to nice 19 too (with autogroups on, Linux
  shares the CPU between sessions first, then by nice within one), so they take the cycles the main
  run leaves idle and little else (two such CPU hogs beside two normal ones got 3% of the CPU); nothing
  in them can time out for want of CPU.
- Then the `serial` benchmark tests, whose llama-server wants both cores, without the main run's
  tests beside them (the lowest-priority ones may still be running: they yield).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PYTEST = [sys.executable, "-m", "pytest", "-q"]
WORKERS = ["-n", "2", "--dist", "loadgroup"]
# A folder every pytest of one run shares: tests/conftest.py once_per_run keeps results there that
# any of them computes once (the float32 reference the cluster and the compute tests both compare with).
RUN_DIR_VARIABLE = "RAYPD_TEST_RUN_DIR"


def autogroups_take_nice() -> bool:
    """Whether a new session's autogroup can be set to nice 19 here (Linux with autogroups and a
    writable /proc). Where it cannot, the lowest-priority processes stay in this session, where their
    own nice 19 counts against the main run's processes; a session of their own at the autogroup's
    default nice 0 would instead get as much CPU as this whole session."""
    probe = subprocess.run(["sh", "-c", "echo 19 > /proc/self/autogroup"], start_new_session=True,
                           capture_output=True)
    return probe.returncode == 0


def lowest_priority(own_session: bool):
    """What the child does before it runs: a process group of its own (stop_group stops it whole), in
    a session and autogroup of its own where own_session, and nice 19."""
    def in_child() -> None:
        if own_session:
            os.setsid()
            Path("/proc/self/autogroup").write_text("19")
        else:
            os.setpgid(0, 0)
        os.nice(19)
    return in_child


def start_low(command: list[str], log: Path, own_session: bool) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=lowest_priority(own_session))


def stop_group(p: subprocess.Popen) -> None:
    """Stop a process group started here and everything in it (pytest's workers, what they started)."""
    if p.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run(command: list[str]) -> int:
    """A command (ruff, a pytest) in this process group, so Ctrl-C reaches it as it does this one;
    stopped as by Ctrl-C (a pytest then stops its workers) if this process is told to stop first."""
    p = subprocess.Popen(command, cwd=ROOT)
    try:
        return p.wait()
    except BaseException:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        raise


def serial_files() -> list[str]:
    """Only the files that mark a test serial: collecting the whole suite for two tests took 15-20 s."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if "mark.serial" in p.read_text())


def main() -> int:
    start = time.monotonic()
    # SIGTERM (a CI's time limit, `kill`) ends this process through the finally below, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    rc = run([str(BIN / "ruff"), "check", "."])
    run_dir = Path(tempfile.mkdtemp(prefix="raypd-make-test-"))
    os.environ[RUN_DIR_VARIABLE] = str(run_dir)
    logs = ROOT / ".venv"
    low: dict[str, tuple[subprocess.Popen, Path]] = {}
    try:
        if rc == 0:
            own_session = autogroups_take_nice()
            for name, command in (("mypy -p raypd", [str(BIN / "mypy"), "-p", "raypd"]),
                                  ("compute tests (lowest priority)",
                                   [*PYTEST, *WORKERS, "-m", "compute", "--durations=10", "tests/engine"])):
                log = logs / f"{name.split()[0]}.log"
                low[name] = start_low(command, log, own_session), log
            # --no-loadscope-reorder: xdist would hand out groups by their number of tests, the one-test
            # benches last, each a 40-80 s tail; the order tests/conftest.py gives (longest kind first) is wanted.
            rc = run([*PYTEST, *WORKERS, "--no-loadscope-reorder", "-m", "not serial and not compute",
                      "--durations=25", "tests"])
            if rc == 0:
                rc = run([*PYTEST, "-m", "serial", *serial_files()])
            for name, (p, log) in low.items():
                code = p.wait()
                print(f"{name} (exit {code}):")
                print(log.read_text(), end="")
                rc = rc or code
    finally:
        for p, _ in low.values():
            stop_group(p)
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"make test: {time.monotonic() - start:.0f} s wall for lint, types and every test (exit {rc})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
